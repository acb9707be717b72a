package filecheck

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Errors of the checks; each is wrapped with the file's name and what to
// do.
var (
	// ErrNotRegular means the file is not a regular file (a FIFO, a
	// device, a directory, a socket).
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge means the file is larger than such a file may be.
	ErrTooLarge = errors.New("larger than allowed")
	// ErrTooOpen means a secret or a data directory is open to other
	// users than its owner.
	ErrTooOpen = errors.New("permissions too open")
	// ErrChanged means the file was replaced while it was opened.
	ErrChanged = errors.New("the file changed while it was opened")
)

// Kind names the type of a file for people: "a FIFO", "a directory".
func Kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a regular file"
}

// ReadRegular reads the regular file path, what it is for people ("the
// snapshot", "tls.ca_file"), of at most max bytes: anything else is refused
// before it is opened (a FIFO would block), and a file that grows beyond
// max while it is read is refused too.
func ReadRegular(path, what string, max int64) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s: %w (%s): it is read from a regular file", what, path, ErrNotRegular, Kind(st.Mode()))
	}
	if st.Size() > max {
		return nil, fmt.Errorf("%s %s: %w: %d bytes, at most %d", what, path, ErrTooLarge, st.Size(), max)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st2, err := f.Stat(); err != nil || !os.SameFile(st, st2) {
		return nil, fmt.Errorf("%s %s: %w", what, path, ErrChanged)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s %s: %w: more than %d bytes", what, path, ErrTooLarge, max)
	}
	return data, nil
}

// CheckPrivateKey refuses a private key file that users other than its
// owner may read or write, as ssh does, with the chmod to run. allowGroup
// (the override, named override for the hint; "" when there is none) lets
// its group read it — a key mounted from a Kubernetes secret with an
// fsGroup is 0440 — but never others.
func CheckPrivateKey(path, what string, allowGroup bool, override string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	mask := fs.FileMode(0o077)
	if allowGroup {
		mask = 0o027 // group may read, not write
	}
	if perm := st.Mode().Perm(); perm&mask != 0 {
		hint := "chmod 600 " + path
		if allowGroup {
			hint = "chmod 640 " + path
		}
		return fmt.Errorf("%s %s: %w: mode %04o lets %s at the private key; run %s%s", what, path, ErrTooOpen, perm, who(perm, allowGroup), hint, overrideHint(allowGroup, override))
	}
	return nil
}

func who(perm fs.FileMode, _ bool) string {
	if perm&0o007 != 0 {
		return "every user"
	}
	return "its group"
}

func overrideHint(allowGroup bool, override string) string {
	if allowGroup || override == "" {
		return ""
	}
	return " (or set " + override + " when its group must read it)"
}

// CheckPrivateDir refuses a data directory that users other than its
// owner may read, write or enter, with the chmod to run; a missing one
// passes (it is created 0700).
func CheckPrivateDir(path, what string) error {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s %s: is %s, not a directory", what, path, Kind(st.Mode()))
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s %s: %w: mode %04o lets other users into the cluster's state; run chmod 700 %s", what, path, ErrTooOpen, perm, path)
	}
	return nil
}
