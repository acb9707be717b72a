package objformat

import (
	"errors"
	"fmt"
	"io"

	"walden/wal"
)

// maxIndexEntries bounds the index a reader accepts, so that a damaged
// footer cannot make it allocate without limit.
const maxIndexEntries = 1 << 20

// ReadIndex reads and verifies the header, footer and index of an object of
// the given size. Every section's position and length are checked to lie
// between the header and the index, in order and without overlap. A damaged
// or truncated object returns ErrCorrupt (or ErrVersion), never an index.
func ReadIndex(r io.ReaderAt, size int64) (*Index, error) {
	if size < HeaderSize+IndexHeaderSize+FooterSize {
		return nil, fmt.Errorf("objformat: object of %d bytes is shorter than the minimum: %w", size, ErrCorrupt)
	}
	var hdr [HeaderSize]byte
	if err := readFull(r, hdr[:], 0); err != nil {
		return nil, fmt.Errorf("objformat: read header: %w", err)
	}
	if err := checkHeader(hdr[:]); err != nil {
		return nil, err
	}
	var ft [FooterSize]byte
	if err := readFull(r, ft[:], size-FooterSize); err != nil {
		return nil, fmt.Errorf("objformat: read footer: %w", err)
	}
	if be.Uint32(ft[28:]) != Magic {
		return nil, fmt.Errorf("objformat: footer magic %#08x: %w", be.Uint32(ft[28:]), ErrCorrupt)
	}
	if got, want := CRC32C(ft[0:24]), be.Uint32(ft[24:]); got != want {
		return nil, fmt.Errorf("objformat: footer CRC32C %#08x, stored %#08x: %w", got, want, ErrCorrupt)
	}
	if v := be.Uint16(ft[20:]); v != Version {
		return nil, fmt.Errorf("objformat: footer version %d: %w", v, ErrVersion)
	}
	if r := be.Uint16(ft[22:]); r != 0 {
		return nil, fmt.Errorf("objformat: footer reserved %#x: %w", r, ErrCorrupt)
	}
	indexPos, indexLen, indexCRC := be.Uint64(ft[0:]), be.Uint64(ft[8:]), be.Uint32(ft[16:])
	dataEnd := uint64(size - FooterSize)
	if indexPos < HeaderSize || indexLen < IndexHeaderSize || indexPos > dataEnd || indexLen != dataEnd-indexPos {
		return nil, fmt.Errorf("objformat: index at %d length %d in an object of %d bytes: %w", indexPos, indexLen, size, ErrCorrupt)
	}
	if (indexLen-IndexHeaderSize)%IndexEntrySize != 0 || (indexLen-IndexHeaderSize)/IndexEntrySize > maxIndexEntries {
		return nil, fmt.Errorf("objformat: index length %d: %w", indexLen, ErrCorrupt)
	}
	index := make([]byte, indexLen)
	if err := readFull(r, index, int64(indexPos)); err != nil {
		return nil, fmt.Errorf("objformat: read index: %w", err)
	}
	if got := CRC32C(index); got != indexCRC {
		return nil, fmt.Errorf("objformat: index CRC32C %#08x, stored %#08x: %w", got, indexCRC, ErrCorrupt)
	}
	n := be.Uint32(index[0:])
	if uint64(n) != (indexLen-IndexHeaderSize)/IndexEntrySize {
		return nil, fmt.Errorf("objformat: index count %d, length %d: %w", n, indexLen, ErrCorrupt)
	}
	ix := &Index{Version: Version, Size: size, Entries: make([]IndexEntry, 0, n)}
	next := uint64(HeaderSize)
	for i := uint32(0); i < n; i++ {
		e := decodeIndexEntry(index[IndexHeaderSize+int(i)*IndexEntrySize:])
		if err := checkEntry(e, next, indexPos); err != nil {
			return nil, fmt.Errorf("objformat: index entry %d (stream %d): %w", i, e.StreamID, err)
		}
		if i > 0 && e.StreamID <= ix.Entries[i-1].StreamID {
			return nil, fmt.Errorf("objformat: index entry %d: stream %d after stream %d: %w", i, e.StreamID, ix.Entries[i-1].StreamID, ErrCorrupt)
		}
		next = e.Position + e.Length
		ix.Entries = append(ix.Entries, e)
	}
	if next != indexPos {
		return nil, fmt.Errorf("objformat: sections end at %d, index starts at %d: %w", next, indexPos, ErrCorrupt)
	}
	return ix, nil
}

func checkHeader(h []byte) error {
	if m := be.Uint32(h[0:]); m != Magic {
		return fmt.Errorf("objformat: header magic %#08x: %w", m, ErrCorrupt)
	}
	if got, want := CRC32C(h[0:12]), be.Uint32(h[12:]); got != want {
		return fmt.Errorf("objformat: header CRC32C %#08x, stored %#08x: %w", got, want, ErrCorrupt)
	}
	if v := be.Uint16(h[4:]); v != Version {
		return fmt.Errorf("objformat: header version %d: %w", v, ErrVersion)
	}
	if flags, reserved := be.Uint16(h[6:]), be.Uint32(h[8:]); flags != 0 || reserved != 0 {
		return fmt.Errorf("objformat: header flags %#x reserved %#x, version 1 has none: %w", flags, reserved, ErrCorrupt)
	}
	return nil
}

func checkEntry(e IndexEntry, pos, indexPos uint64) error {
	switch {
	case e.Position != pos:
		return fmt.Errorf("section at %d, expected %d: %w", e.Position, pos, ErrCorrupt)
	case e.Length < BatchHeaderSize || e.Length > indexPos-e.Position:
		return fmt.Errorf("section length %d: %w", e.Length, ErrCorrupt)
	case e.BatchCount == 0 || uint64(e.BatchCount) > e.Length/BatchHeaderSize:
		return fmt.Errorf("batch count %d for %d bytes: %w", e.BatchCount, e.Length, ErrCorrupt)
	case e.EndOffset < e.StartOffset+uint64(e.BatchCount) || e.StartOffset+uint64(e.BatchCount) < e.StartOffset:
		return fmt.Errorf("offsets [%d, %d) for %d batches: %w", e.StartOffset, e.EndOffset, e.BatchCount, ErrCorrupt)
	}
	return nil
}

// ReadSection reads one stream's section described by e (from ReadIndex)
// and returns its batches, after checking the section's CRC32C and that the
// batches cover exactly [e.StartOffset, e.EndOffset) without gaps.
func ReadSection(r io.ReaderAt, e IndexEntry) ([]wal.Batch, error) {
	if e.Length > 1<<40 {
		return nil, fmt.Errorf("objformat: stream %d: section length %d: %w", e.StreamID, e.Length, ErrCorrupt)
	}
	buf := make([]byte, e.Length)
	if err := readFull(r, buf, int64(e.Position)); err != nil {
		return nil, fmt.Errorf("objformat: stream %d: read section: %w", e.StreamID, err)
	}
	return ParseSection(buf, e)
}

// ParseSection decodes a section's bytes (for example fetched with a ranged
// GET of [e.Position, e.Position+e.Length)) with the same checks as
// ReadSection. The returned payloads alias data.
func ParseSection(data []byte, e IndexEntry) ([]wal.Batch, error) {
	if uint64(len(data)) != e.Length {
		return nil, fmt.Errorf("objformat: stream %d: section of %d bytes, index says %d: %w", e.StreamID, len(data), e.Length, ErrCorrupt)
	}
	if got := CRC32C(data); got != e.CRC32C {
		return nil, fmt.Errorf("objformat: stream %d: section CRC32C %#08x, stored %#08x: %w", e.StreamID, got, e.CRC32C, ErrCorrupt)
	}
	if e.BatchCount == 0 || uint64(e.BatchCount) > e.Length/BatchHeaderSize {
		return nil, fmt.Errorf("objformat: stream %d: batch count %d: %w", e.StreamID, e.BatchCount, ErrCorrupt)
	}
	batches := make([]wal.Batch, 0, e.BatchCount)
	next := e.StartOffset
	for p := 0; p < len(data); {
		if len(data)-p < BatchHeaderSize {
			return nil, fmt.Errorf("objformat: stream %d: truncated batch header at %d: %w", e.StreamID, p, ErrCorrupt)
		}
		base, count, plen := be.Uint64(data[p:]), be.Uint32(data[p+8:]), be.Uint32(data[p+12:])
		p += BatchHeaderSize
		if uint64(plen) > uint64(len(data)-p) {
			return nil, fmt.Errorf("objformat: stream %d: payload of %d bytes at %d overruns the section: %w", e.StreamID, plen, p, ErrCorrupt)
		}
		if base != next || count == 0 || base+uint64(count) < base {
			return nil, fmt.Errorf("objformat: stream %d: batch [%d, +%d) where %d was expected: %w", e.StreamID, base, count, next, ErrCorrupt)
		}
		batches = append(batches, wal.Batch{
			StreamID:   e.StreamID,
			Epoch:      e.StreamEpoch,
			BaseOffset: base,
			Count:      count,
			Payload:    data[p : p+int(plen) : p+int(plen)],
		})
		p += int(plen)
		next = base + uint64(count)
	}
	if len(batches) != int(e.BatchCount) || next != e.EndOffset {
		return nil, fmt.Errorf("objformat: stream %d: %d batches ending at %d, index says %d ending at %d: %w",
			e.StreamID, len(batches), next, e.BatchCount, e.EndOffset, ErrCorrupt)
	}
	return batches, nil
}

// ReadAll reads an object's index and every section, verifying all
// checksums, and returns the batches in object order (ascending stream id,
// then offset).
func ReadAll(r io.ReaderAt, size int64) (*Index, []wal.Batch, error) {
	ix, err := ReadIndex(r, size)
	if err != nil {
		return nil, nil, err
	}
	var all []wal.Batch
	for _, e := range ix.Entries {
		bs, err := ReadSection(r, e)
		if err != nil {
			return nil, nil, err
		}
		all = append(all, bs...)
	}
	return ix, all, nil
}

func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return fmt.Errorf("short read of %d bytes at %d (got %d): %w", len(p), off, n, ErrCorrupt)
	}
	return err
}
