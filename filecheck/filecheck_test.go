package filecheck

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	ok := filepath.Join(dir, "ok")
	if err := os.WriteFile(ok, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		max  int64
		want error
		says string
	}{
		{"/dev/zero", 1 << 20, ErrNotRegular, "a character device"},
		{fifo, 1 << 20, ErrNotRegular, "a FIFO"},
		{dir, 1 << 20, ErrNotRegular, "a directory"},
		{ok, 4, ErrTooLarge, "5 bytes, at most 4"},
	} {
		done := make(chan error, 1)
		go func() { _, err := ReadRegular(tc.path, "the snapshot", tc.max); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), tc.path) {
				t.Errorf("%s: %v, want %v saying %q", tc.path, err, tc.want, tc.says)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still reading after 5s", tc.path)
		}
	}
	if b, err := ReadRegular(ok, "x", 5); err != nil || string(b) != "hello" {
		t.Fatalf("a regular file: %q %v", b, err)
	}
}

func TestPermissions(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "k.pem")
	if err := os.WriteFile(key, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode       os.FileMode
		allowGroup bool
		refused    string
	}{
		{0o600, false, ""},
		{0o400, false, ""},
		{0o640, false, "mode 0640 lets its group at the private key; run chmod 600"},
		{0o644, false, "mode 0644 lets every user at the private key; run chmod 600"},
		{0o440, true, ""},
		{0o640, true, ""},
		{0o644, true, "mode 0644 lets every user at the private key; run chmod 640"},
		{0o660, true, "mode 0660"},
	} {
		if err := os.Chmod(key, tc.mode); err != nil {
			t.Fatal(err)
		}
		err := CheckPrivateKey(key, "tls.key_file", tc.allowGroup, "tls.allow_group_readable_key: true")
		if tc.refused == "" && err != nil || tc.refused != "" && (!errors.Is(err, ErrTooOpen) || !strings.Contains(err.Error(), tc.refused)) {
			t.Errorf("mode %04o allowGroup %v: %v, want %q", tc.mode, tc.allowGroup, err, tc.refused)
		}
	}
	data := filepath.Join(dir, "data")
	if err := CheckPrivateDir(data, "data_dir"); err != nil {
		t.Fatalf("a missing data_dir: %v", err)
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := CheckPrivateDir(data, "data_dir"); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(data, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := CheckPrivateDir(data, "data_dir"); !errors.Is(err, ErrTooOpen) || !strings.Contains(err.Error(), "run chmod 700 "+data) {
		t.Fatalf("a 0777 data_dir: %v", err)
	}
}
