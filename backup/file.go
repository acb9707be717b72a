package backup

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	"walden/filecheck"
	waldenv1 "walden/proto/walden/v1"
)

var (
	// ErrNotSnapshot is returned for a file that is not a walden snapshot
	// (another format, or too short to be one).
	ErrNotSnapshot = errors.New("not a walden snapshot file")
	// ErrCorrupt is returned for a snapshot file whose checksum, lengths or
	// contents do not hold.
	ErrCorrupt = errors.New("snapshot file is damaged")
	// ErrExists is returned when the file to write already exists.
	ErrExists = errors.New("file already exists")
)

// magic opens every snapshot file.
const magic = "WALDNSNP"

// maxHeader bounds the header length read from a file.
const maxHeader = 1 << 20

// MaxFileBytes bounds a snapshot file ReadFile reads: the state a raft
// snapshot carries is at most 512 MiB (raftnode.MaxRaftMessageBytes), and
// a file holds one with its header and checksum.
const MaxFileBytes = 1 << 30

// Snapshot is a verified snapshot: its header, its data and the SHA-256 of
// the file.
type Snapshot struct {
	Header *waldenv1.SnapshotHeader
	// Data is a walden.v1.StateSnapshot.
	Data []byte
	// SHA256 is the checksum that ends the file.
	SHA256 [sha256.Size]byte
}

// Encode returns the bytes of the snapshot file of h and data (h.size is
// set to len(data)) and the checksum that ends it.
func Encode(h *waldenv1.SnapshotHeader, data []byte) ([]byte, [sha256.Size]byte, error) {
	h = proto.Clone(h).(*waldenv1.SnapshotHeader)
	h.Size = uint64(len(data))
	hb, err := proto.MarshalOptions{Deterministic: true}.Marshal(h)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("backup: encode header: %w", err)
	}
	var buf bytes.Buffer
	buf.Grow(len(magic) + 4 + len(hb) + len(data) + sha256.Size)
	buf.WriteString(magic)
	_ = binary.Write(&buf, binary.BigEndian, uint32(len(hb)))
	buf.Write(hb)
	buf.Write(data)
	sum := sha256.Sum256(buf.Bytes())
	buf.Write(sum[:])
	return buf.Bytes(), sum, nil
}

// Decode verifies and decodes the bytes of a snapshot file.
func Decode(b []byte) (*Snapshot, error) {
	if len(b) < len(magic)+4+sha256.Size || string(b[:len(magic)]) != magic {
		return nil, ErrNotSnapshot
	}
	body, trailer := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	s := &Snapshot{}
	copy(s.SHA256[:], trailer)
	if sha256.Sum256(body) != s.SHA256 {
		return nil, fmt.Errorf("%w: the SHA-256 checksum does not match (truncated or altered)", ErrCorrupt)
	}
	hl := binary.BigEndian.Uint32(body[len(magic):])
	rest := body[len(magic)+4:]
	if hl > maxHeader || int(hl) > len(rest) {
		return nil, fmt.Errorf("%w: header length %d", ErrCorrupt, hl)
	}
	s.Header = &waldenv1.SnapshotHeader{}
	if err := proto.Unmarshal(rest[:hl], s.Header); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	s.Data = rest[hl:]
	if uint64(len(s.Data)) != s.Header.GetSize() {
		return nil, fmt.Errorf("%w: %d data bytes, the header says %d", ErrCorrupt, len(s.Data), s.Header.GetSize())
	}
	st := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(s.Data, st); err != nil {
		return nil, fmt.Errorf("%w: state: %v", ErrCorrupt, err)
	}
	if st.GetClusterName() != s.Header.GetClusterName() || st.GetAppliedIndex() != s.Header.GetIndex() {
		return nil, fmt.Errorf("%w: the header says cluster %q index %d, the state cluster %q index %d", ErrCorrupt,
			s.Header.GetClusterName(), s.Header.GetIndex(), st.GetClusterName(), st.GetAppliedIndex())
	}
	return s, nil
}

// ReadFile reads and verifies the snapshot file path: a regular file of at
// most MaxFileBytes, checked before it is opened (/dev/zero grew without
// end, a FIFO hung).
func ReadFile(path string) (*Snapshot, error) {
	b, err := filecheck.ReadRegular(path, "snapshot file", MaxFileBytes)
	if err != nil {
		return nil, err
	}
	s, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// WriteFile writes the snapshot file of h and data to path, durably: to
// path.part first, synced, then renamed, so that path is either absent or
// complete. An existing path is refused (a backup is never overwritten).
func WriteFile(path string, h *waldenv1.SnapshotHeader, data []byte) ([sha256.Size]byte, error) {
	b, sum, err := Encode(h, data)
	if err != nil {
		return sum, err
	}
	if _, err := os.Lstat(path); err == nil {
		return sum, fmt.Errorf("%s: %w", path, ErrExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return sum, err
	}
	tmp := path + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return sum, err
	}
	_, err = io.Copy(f, bytes.NewReader(b))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, path) // fails if path appeared meanwhile
	}
	_ = os.Remove(tmp)
	if err != nil {
		return sum, fmt.Errorf("backup: write %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return sum, nil
}
