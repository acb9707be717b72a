package raftlog

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"walden/internal/testutil"
)

// crashFS is a storageFS on the real files that remembers what a power
// loss could still take away, and builds the disk images one could leave
// (image). The model, which is what fsync promises on Linux file systems:
//   - data written to a file is durable once the file is synced (fdatasync
//     or fsync); until then each 512-byte sector of a write may or may not
//     have reached the disk, independently of the others;
//   - a name created, renamed or removed in a directory is durable once the
//     directory is synced; until then a suffix of those operations may be
//     lost (the file system's journal keeps them in order).
//
// raft.db is written by bbolt directly, not through this layer: bbolt makes
// a transaction durable (and atomic) before Commit returns, and the crash
// points are between transactions, so the file as it is at a crash point is
// what a power loss leaves of it.
type crashFS struct {
	osFS
	root string // the data directory; images copy it

	mu      sync.Mutex
	pending map[string][]pendingWrite // by file path
	dirOps  map[string][]dirOp        // by directory path
	open    []*crashFile              // files opened, to follow renames
}

type pendingWrite struct {
	off      int64
	old, new []byte
}

type dirOp struct {
	kind     string // create, mkdir, rename, remove
	name, to string
	// removed holds what a remove took away (relative path to content).
	removed map[string][]byte
}

func newCrashFS(root string) *crashFS {
	return &crashFS{root: root, pending: make(map[string][]pendingWrite), dirOps: make(map[string][]dirOp)}
}

func (c *crashFS) addDirOp(op dirOp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dir := filepath.Dir(op.name)
	c.dirOps[dir] = append(c.dirOps[dir], op)
}

func (c *crashFS) MkdirAll(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := c.osFS.MkdirAll(dir); err != nil {
		return err
	}
	c.addDirOp(dirOp{kind: "mkdir", name: dir})
	return nil
}

func (c *crashFS) Open(name string) (storageFile, error) {
	f, err := c.osFS.Open(name)
	if err != nil {
		return nil, err
	}
	return c.track(&crashFile{storageFile: f, fs: c, path: name}), nil
}

func (c *crashFS) OpenRW(name string) (storageFile, error) {
	f, err := c.osFS.OpenRW(name)
	if err != nil {
		return nil, err
	}
	return c.track(&crashFile{storageFile: f, fs: c, path: name}), nil
}

func (c *crashFS) Create(name string, size int64) (storageFile, error) {
	f, err := c.osFS.Create(name, size)
	if err != nil {
		return nil, err
	}
	c.addDirOp(dirOp{kind: "create", name: name})
	return c.track(&crashFile{storageFile: f, fs: c, path: name}), nil
}

func (c *crashFS) Rename(from, to string) error {
	if err := c.osFS.Rename(from, to); err != nil {
		return err
	}
	c.mu.Lock()
	if p, ok := c.pending[from]; ok {
		c.pending[to] = p
		delete(c.pending, from)
	}
	for _, f := range c.open {
		if f.path == from {
			f.path = to
		}
	}
	c.mu.Unlock()
	c.addDirOp(dirOp{kind: "rename", name: from, to: to})
	return nil
}

func (c *crashFS) Remove(name string) error {
	saved := readTree(name)
	if err := c.osFS.Remove(name); err != nil {
		return err
	}
	c.addDirOp(dirOp{kind: "remove", name: name, removed: saved})
	return nil
}

func (c *crashFS) RemoveAll(name string) error {
	saved := readTree(name)
	if err := c.osFS.RemoveAll(name); err != nil {
		return err
	}
	c.addDirOp(dirOp{kind: "remove", name: name, removed: saved})
	return nil
}

func (c *crashFS) SyncDir(dir string) error {
	if err := c.osFS.SyncDir(dir); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.dirOps, dir)
	c.mu.Unlock()
	return nil
}

// readTree reads the files under path (a file or a directory), by path
// relative to path ("" for path itself).
func readTree(path string) map[string][]byte {
	out := make(map[string][]byte)
	_ = filepath.Walk(path, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(path, p)
		if info.IsDir() {
			out[rel+"/"] = nil
			return nil
		}
		if b, err := os.ReadFile(p); err == nil {
			out[rel] = b
		}
		return nil
	})
	return out
}

func (c *crashFS) track(f *crashFile) *crashFile {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open = append(c.open, f)
	return f
}

type crashFile struct {
	storageFile
	fs   *crashFS
	path string
}

func (f *crashFile) WriteAt(p []byte, off int64) (int, error) {
	old := make([]byte, len(p))
	n, _ := f.storageFile.ReadAt(old, off)
	old = old[:n]
	w, err := f.storageFile.WriteAt(p, off)
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	f.fs.pending[f.path] = append(f.fs.pending[f.path], pendingWrite{off: off, old: old, new: append([]byte(nil), p[:w]...)})
	return w, err
}

func (f *crashFile) synced() {
	f.fs.mu.Lock()
	delete(f.fs.pending, f.path)
	f.fs.mu.Unlock()
}

func (f *crashFile) Datasync() error {
	if err := f.storageFile.Datasync(); err != nil {
		return err
	}
	f.synced()
	return nil
}

func (f *crashFile) Sync() error {
	if err := f.storageFile.Sync(); err != nil {
		return err
	}
	f.synced()
	return nil
}

// crashMode says how much of what was not synced an image loses.
type crashMode int

const (
	loseNothing crashMode = iota // a process crash: the page cache survives
	loseAll                      // nothing unsynced reached the disk
	loseSome                     // each unsynced sector and a suffix of directory changes, at random
)

func (m crashMode) String() string {
	return [...]string{"lose-nothing", "lose-all", "lose-some"}[m]
}

// image copies the data directory to dst as a power loss now could leave it.
func (c *crashFS) image(t testing.TB, dst string, mode crashMode, rng *rand.Rand) {
	t.Helper()
	testutil.CopyTree(t, c.root, dst)
	if mode == loseNothing {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rel := func(p string) string {
		r, err := filepath.Rel(c.root, p)
		if err != nil || strings.HasPrefix(r, "..") {
			t.Fatalf("path %s outside %s", p, c.root)
		}
		return filepath.Join(dst, r)
	}
	// Directory changes first: a suffix of each directory's is lost,
	// newest first.
	dirs := make([]string, 0, len(c.dirOps))
	for d := range c.dirOps {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		ops := c.dirOps[d]
		keep := 0
		if mode == loseSome {
			keep = rng.IntN(len(ops) + 1)
		}
		for i := len(ops) - 1; i >= keep; i-- {
			op := ops[i]
			switch op.kind {
			case "create", "mkdir":
				_ = os.RemoveAll(rel(op.name))
			case "rename":
				_ = os.Rename(rel(op.to), rel(op.name))
			case "remove":
				for r, b := range op.removed {
					p := filepath.Join(rel(op.name), r)
					if strings.HasSuffix(r, "/") {
						_ = os.MkdirAll(p, 0o700)
						continue
					}
					_ = os.MkdirAll(filepath.Dir(p), 0o700)
					if err := os.WriteFile(p, b, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
	// Then unsynced data: each sector of each write is lost or kept.
	for path, writes := range c.pending {
		f, err := os.OpenFile(rel(path), os.O_RDWR, 0)
		if err != nil {
			continue // its name did not survive
		}
		for i := len(writes) - 1; i >= 0; i-- {
			w := writes[i]
			for s := w.off; s < w.off+int64(len(w.new)); {
				next := min(w.off+int64(len(w.new)), (s/sectorSize+1)*sectorSize)
				if mode == loseAll || rng.IntN(2) == 0 {
					lo, hi := s-w.off, next-w.off
					old := make([]byte, hi-lo)
					if lo < int64(len(w.old)) {
						copy(old, w.old[lo:min(hi, int64(len(w.old)))])
					}
					if _, err := f.WriteAt(old, s); err != nil {
						t.Fatal(err)
					}
				}
				s = next
			}
		}
		_ = f.Close()
	}
}
