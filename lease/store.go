package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Durable is what a coordinator must remember across restarts about its
// grants: the largest TTL and drift it may have granted with (the length of
// its quiet period after a restart) and the (broker, epoch) pairs it promised
// never to grant again.
type Durable struct {
	MaxTTL   time.Duration `json:"max_ttl_ns"`
	MaxDrift time.Duration `json:"max_drift_ns"`
	Promises []Key         `json:"promises"`
}

// Store keeps a coordinator's Durable state. Save must be durable (synced)
// when it returns.
type Store interface {
	Load() (Durable, error)
	Save(Durable) error
}

// ErrCorruptStore is returned by FileStore.Load for a file that does not
// decode.
var ErrCorruptStore = errors.New("lease: lease state file is damaged")

// FileStore keeps Durable in one JSON file, replaced atomically (write,
// fsync, rename, fsync of the directory).
type FileStore struct{ Path string }

// Load implements Store; a missing file is the empty state.
func (f FileStore) Load() (Durable, error) {
	var d Durable
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("lease: read %s: %w", f.Path, err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return Durable{}, fmt.Errorf("%w: %s: %v", ErrCorruptStore, f.Path, err)
	}
	return d, nil
}

// Save implements Store.
func (f FileStore) Save(d Durable) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	tmp := f.Path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("lease: save %s: %w", f.Path, err)
	}
	_, werr := fh.Write(b)
	serr := fh.Sync()
	cerr := fh.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("lease: save %s: %w", f.Path, err)
	}
	if err := os.Rename(tmp, f.Path); err != nil {
		return fmt.Errorf("lease: save %s: %w", f.Path, err)
	}
	dir, err := os.Open(filepath.Dir(f.Path))
	if err != nil {
		return fmt.Errorf("lease: save %s: %w", f.Path, err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("lease: save %s: sync directory: %w", f.Path, err)
	}
	return nil
}

// MemStore is a Store in memory (tests and the simulation): it survives a
// Grantor, as a file survives a process.
type MemStore struct {
	mu sync.Mutex
	d  Durable
	// Err, when set, is returned by Save (a full disk).
	Err error
}

// Load implements Store.
func (m *MemStore) Load() (Durable, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.d
	d.Promises = slices.Clone(d.Promises)
	return d, nil
}

// Save implements Store.
func (m *MemStore) Save(d Durable) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Err != nil {
		return m.Err
	}
	d.Promises = slices.Clone(d.Promises)
	m.d = d
	return nil
}
