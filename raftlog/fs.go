package raftlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// storageFS is the file system under the raft log's segment files: the only
// calls the log makes to the disk (raft.db goes through bbolt). Production
// uses the operating system (osFS); the crash tests use a layer that
// remembers what was not yet synced and builds the disk images a power loss
// could leave.
type storageFS interface {
	// MkdirAll creates dir and its parents (mode 0700).
	MkdirAll(dir string) error
	// ReadDir returns the names in dir, sorted.
	ReadDir(dir string) ([]string, error)
	// Open opens an existing file for reading.
	Open(name string) (storageFile, error)
	// OpenRW opens an existing file for reading and writing.
	OpenRW(name string) (storageFile, error)
	// Create creates a new file (it must not exist) of size bytes, read as
	// zeros, allocated on disk where the file system allows it.
	Create(name string, size int64) (storageFile, error)
	Rename(from, to string) error
	Remove(name string) error
	// RemoveAll removes name and everything under it.
	RemoveAll(name string) error
	// SyncDir makes the names created, renamed and removed in dir durable.
	SyncDir(dir string) error
}

// storageFile is an open file of a storageFS.
type storageFile interface {
	io.ReaderAt
	io.WriterAt
	// Datasync makes the data written durable (fdatasync): enough when the
	// size did not change.
	Datasync() error
	// Sync makes the data and the metadata durable (fsync).
	Sync() error
	Size() (int64, error)
	Close() error
}

// osFS is storageFS on the operating system's files.
type osFS struct{}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o700) }

func (osFS) ReadDir(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(des))
	for i, d := range des {
		names[i] = d.Name()
	}
	sort.Strings(names)
	return names, nil
}

func (osFS) Open(name string) (storageFile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) OpenRW(name string) (storageFile, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Create(name string, size int64) (storageFile, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := allocate(f, size); err != nil {
		_ = f.Close()
		_ = os.Remove(name)
		return nil, err
	}
	return osFile{f}, nil
}

// allocate gives f size bytes on disk, so that writing into them later
// changes no file size and fdatasync has only data to flush. A file system
// without fallocate gets a sparse file of that size.
func allocate(f *os.File, size int64) error {
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return f.Truncate(size)
	}
	return fmt.Errorf("allocate %d bytes for %s: %w", size, f.Name(), err)
}

func (osFS) Rename(from, to string) error { return os.Rename(from, to) }
func (osFS) Remove(name string) error     { return os.Remove(name) }
func (osFS) RemoveAll(name string) error  { return os.RemoveAll(name) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

type osFile struct{ f *os.File }

func (o osFile) ReadAt(p []byte, off int64) (int, error)  { return o.f.ReadAt(p, off) }
func (o osFile) WriteAt(p []byte, off int64) (int, error) { return o.f.WriteAt(p, off) }
func (o osFile) Datasync() error                          { return unix.Fdatasync(int(o.f.Fd())) }
func (o osFile) Sync() error                              { return o.f.Sync() }
func (o osFile) Close() error                             { return o.f.Close() }

func (o osFile) Size() (int64, error) {
	info, err := o.f.Stat()
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

// syncDir makes the names in dir durable (used for the data directory
// itself, which holds raft.db).
func syncDir(dir string) error {
	if err := (osFS{}).SyncDir(dir); err != nil {
		return fmt.Errorf("raftlog: sync data dir %s: %w", filepath.Clean(dir), err)
	}
	return nil
}
