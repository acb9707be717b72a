package main

import (
	"sync"

	"walden/config"
	"walden/mtls"
)

// tlsFiles holds the tls section a process's client connections use, read
// again at SIGHUP (certificate rotation) by reload.
type tlsFiles struct {
	mu    sync.Mutex
	files config.TLS
	r     *mtls.Reloader
}

// newTLSFiles loads the files c names.
func newTLSFiles(c config.TLS) (*tlsFiles, error) {
	t := &tlsFiles{files: c}
	r, err := mtls.NewReloader(func() (mtls.Configs, error) {
		t.mu.Lock()
		files := t.files
		t.mu.Unlock()
		return mtls.Load(files)
	})
	if err != nil {
		return nil, err
	}
	t.r = r
	return t, nil
}

// reload reads the files c names; on an error the previous ones stay.
func (t *tlsFiles) reload(c config.TLS) error {
	t.mu.Lock()
	old := t.files
	t.files = c
	t.mu.Unlock()
	if err := t.r.Reload(); err != nil {
		t.mu.Lock()
		t.files = old
		t.mu.Unlock()
		return err
	}
	return nil
}
