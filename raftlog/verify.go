package raftlog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
)

// The on-disk layout of a bbolt file (go.etcd.io/bbolt, file format version
// 2), as far as verifyBoltFile reads it. Integers are in the machine's byte
// order, as bbolt writes them.
const (
	boltMagic          = 0xED0CDAED
	boltVersion        = 2
	boltPageHeaderSize = 16 // id u64, flags u16, count u16, overflow u32
	boltElementSize    = 16 // branch: pos, ksize u32, pgid u64; leaf: flags, pos, ksize, vsize u32
	boltMetaSize       = 64 // magic, version, pageSize, flags u32; root, sequence, freelist, pgid, txid, checksum u64
	boltBucketHeader   = 16 // root pgid u64, sequence u64

	boltBranchPage   = 0x01
	boltLeafPage     = 0x02
	boltFreelistPage = 0x10
	boltBucketLeaf   = 0x01
	boltNoFreelist   = ^uint64(0)

	// boltMaxDepth bounds the nesting of b-tree levels and buckets.
	boltMaxDepth = 64
)

var boltEndian = binary.NativeEndian

// boltMeta is the decoded meta page that bbolt would use.
type boltMeta struct {
	pageSize           uint32
	root               uint64
	freelist, hwm, txn uint64
}

// verifyBoltFile checks the structure of the bbolt file r of size bytes
// without mapping it: a valid meta page, a high-water mark inside the file,
// and a b-tree in which every page is inside the file, of the expected type,
// referenced once, with every element, key and value inside its page and the
// keys of a page in order and inside the range their parent gives; and a
// synced freelist of pages that are not in use. bbolt
// keeps no checksums on data pages and trusts them when it maps the file, so
// damage found here would otherwise fault, loop or exhaust memory.
func verifyBoltFile(r io.ReaderAt, size int64) error {
	meta, err := readBoltMeta(r, size)
	if err != nil {
		return err
	}
	ps := int64(meta.pageSize)
	if need := int64(meta.hwm) * ps; need > size || meta.hwm < 2 {
		return fmt.Errorf("truncated: file is %d bytes, its meta page says %d", size, need)
	}
	v := &boltVerifier{r: r, pageSize: ps, hwm: meta.hwm, seen: map[uint64]bool{0: true, 1: true}}
	if meta.freelist == boltNoFreelist {
		// walden always syncs the freelist; bbolt would rebuild and write
		// it on the read-write open, changing the file.
		return fmt.Errorf("meta page has no freelist (written with NoFreelistSync)")
	}
	if err := v.walk(meta.root, 0, "root", nil, nil); err != nil {
		return err
	}
	return v.checkFreelist(meta.freelist)
}

// readBoltMeta picks the meta page bbolt would use: of the valid ones, the
// one with the higher transaction id.
func readBoltMeta(r io.ReaderAt, size int64) (boltMeta, error) {
	var metas []boltMeta
	// Page 0 holds the page size; page 1 is found with it, or by trying the
	// usual page sizes when page 0 is damaged.
	m0, err0 := readBoltMetaAt(r, 0)
	sizes := []int64{4096, 8192, 16384, 32768, 65536}
	if err0 == nil {
		metas = append(metas, m0)
		sizes = []int64{int64(m0.pageSize)}
	}
	for _, ps := range sizes {
		if ps >= size {
			continue
		}
		if m1, err := readBoltMetaAt(r, ps); err == nil && int64(m1.pageSize) == ps {
			metas = append(metas, m1)
			break
		}
	}
	if len(metas) == 0 {
		return boltMeta{}, fmt.Errorf("no valid meta page: %v", err0)
	}
	best := metas[0]
	for _, m := range metas[1:] {
		if m.txn > best.txn {
			best = m
		}
	}
	if best.pageSize < 1024 || best.pageSize > 1<<20 || best.pageSize&(best.pageSize-1) != 0 {
		return boltMeta{}, fmt.Errorf("meta page has page size %d", best.pageSize)
	}
	return best, nil
}

func readBoltMetaAt(r io.ReaderAt, off int64) (boltMeta, error) {
	buf := make([]byte, boltPageHeaderSize+boltMetaSize)
	if _, err := r.ReadAt(buf, off); err != nil {
		return boltMeta{}, fmt.Errorf("read meta page at %d: %v", off, err)
	}
	m := buf[boltPageHeaderSize:]
	if boltEndian.Uint32(m[0:]) != boltMagic {
		return boltMeta{}, fmt.Errorf("meta page at %d: bad magic", off)
	}
	if ver := boltEndian.Uint32(m[4:]); ver != boltVersion {
		return boltMeta{}, fmt.Errorf("meta page at %d: bbolt format version %d", off, ver)
	}
	h := fnv.New64a()
	_, _ = h.Write(m[:56])
	if h.Sum64() != boltEndian.Uint64(m[56:]) {
		return boltMeta{}, fmt.Errorf("meta page at %d: bad checksum", off)
	}
	return boltMeta{
		pageSize: boltEndian.Uint32(m[8:]),
		root:     boltEndian.Uint64(m[16:]),
		freelist: boltEndian.Uint64(m[32:]),
		hwm:      boltEndian.Uint64(m[40:]),
		txn:      boltEndian.Uint64(m[48:]),
	}, nil
}

type boltVerifier struct {
	r        io.ReaderAt
	pageSize int64
	hwm      uint64
	// seen holds every page id in use (overflow pages included).
	seen map[uint64]bool
}

// readPage reads page id with its overflow pages and claims them.
func (v *boltVerifier) readPage(id uint64, what string) ([]byte, error) {
	if id < 2 || id >= v.hwm {
		return nil, fmt.Errorf("%s: page %d outside the file's %d pages", what, id, v.hwm)
	}
	hdr := make([]byte, boltPageHeaderSize)
	if _, err := v.r.ReadAt(hdr, int64(id)*v.pageSize); err != nil {
		return nil, fmt.Errorf("%s: read page %d: %v", what, id, err)
	}
	if got := boltEndian.Uint64(hdr); got != id {
		return nil, fmt.Errorf("%s: page %d says it is page %d", what, id, got)
	}
	overflow := uint64(boltEndian.Uint32(hdr[12:]))
	if id+overflow >= v.hwm {
		return nil, fmt.Errorf("%s: page %d has %d overflow pages, past the file's %d pages", what, id, overflow, v.hwm)
	}
	for i := id; i <= id+overflow; i++ {
		if v.seen[i] {
			return nil, fmt.Errorf("%s: page %d is referenced twice", what, i)
		}
		v.seen[i] = true
	}
	buf := make([]byte, int64(overflow+1)*v.pageSize)
	if _, err := v.r.ReadAt(buf, int64(id)*v.pageSize); err != nil {
		return nil, fmt.Errorf("%s: read page %d: %v", what, id, err)
	}
	return buf, nil
}

// walk checks the b-tree page id and everything below it; its keys must lie
// in [lo, hi) (nil: unbounded), as its parent's keys say.
func (v *boltVerifier) walk(id uint64, depth int, what string, lo, hi []byte) error {
	if depth > boltMaxDepth {
		return fmt.Errorf("%s: b-tree deeper than %d levels", what, boltMaxDepth)
	}
	page, err := v.readPage(id, what)
	if err != nil {
		return err
	}
	return v.checkPage(page, id, depth, what, lo, hi)
}

// checkPage checks one branch or leaf page held in page (a file page or an
// inline bucket's value).
func (v *boltVerifier) checkPage(page []byte, id uint64, depth int, what string, lo, hi []byte) error {
	if len(page) < boltPageHeaderSize {
		return fmt.Errorf("%s: page %d shorter than its header", what, id)
	}
	flags := boltEndian.Uint16(page[8:])
	count := int(boltEndian.Uint16(page[10:]))
	if boltPageHeaderSize+count*boltElementSize > len(page) {
		return fmt.Errorf("%s: page %d has %d elements, more than fit", what, id, count)
	}
	var prev []byte
	for i := range count {
		e := page[boltPageHeaderSize+i*boltElementSize:]
		var key, val []byte
		var child uint64
		var isBucket bool
		switch flags {
		case boltBranchPage:
			pos, ksize := int64(boltEndian.Uint32(e[0:])), int64(boltEndian.Uint32(e[4:]))
			child = boltEndian.Uint64(e[8:])
			start := int64(boltPageHeaderSize+i*boltElementSize) + pos
			if start+ksize > int64(len(page)) {
				return fmt.Errorf("%s: page %d element %d: key outside the page", what, id, i)
			}
			key = page[start : start+ksize]
		case boltLeafPage:
			eflags, pos := boltEndian.Uint32(e[0:]), int64(boltEndian.Uint32(e[4:]))
			ksize, vsize := int64(boltEndian.Uint32(e[8:])), int64(boltEndian.Uint32(e[12:]))
			start := int64(boltPageHeaderSize+i*boltElementSize) + pos
			if start+ksize+vsize > int64(len(page)) {
				return fmt.Errorf("%s: page %d element %d: key or value outside the page", what, id, i)
			}
			key, val = page[start:start+ksize], page[start+ksize:start+ksize+vsize]
			isBucket = eflags&boltBucketLeaf != 0
		default:
			return fmt.Errorf("%s: page %d has type %#x, not a branch or leaf page", what, id, flags)
		}
		if i > 0 && bytes.Compare(prev, key) >= 0 {
			return fmt.Errorf("%s: page %d element %d: keys out of order", what, id, i)
		}
		if (lo != nil && bytes.Compare(key, lo) < 0) || (hi != nil && bytes.Compare(key, hi) >= 0) {
			return fmt.Errorf("%s: page %d element %d: key outside the range its parent gives", what, id, i)
		}
		prev = key
		switch {
		case flags == boltBranchPage:
			childHi := hi
			if i+1 < count {
				ne := page[boltPageHeaderSize+(i+1)*boltElementSize:]
				pos, ksize := int64(boltEndian.Uint32(ne[0:])), int64(boltEndian.Uint32(ne[4:]))
				start := int64(boltPageHeaderSize+(i+1)*boltElementSize) + pos
				if start+ksize > int64(len(page)) {
					return fmt.Errorf("%s: page %d element %d: key outside the page", what, id, i+1)
				}
				childHi = page[start : start+ksize]
			}
			if err := v.walk(child, depth+1, what, key, childHi); err != nil {
				return err
			}
		case isBucket:
			if err := v.checkBucket(val, depth+1, fmt.Sprintf("%s/%q", what, key)); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkBucket checks a bucket from its value: a header and either a root
// page or an inline page.
func (v *boltVerifier) checkBucket(val []byte, depth int, what string) error {
	if depth > boltMaxDepth {
		return fmt.Errorf("%s: buckets nested deeper than %d levels", what, boltMaxDepth)
	}
	if len(val) < boltBucketHeader {
		return fmt.Errorf("%s: bucket header too short", what)
	}
	if root := boltEndian.Uint64(val); root != 0 {
		return v.walk(root, depth, what, nil, nil)
	}
	return v.checkPage(val[boltBucketHeader:], 0, depth, what+" (inline)", nil, nil)
}

// checkFreelist checks that the free pages are inside the file, listed once
// and not in use.
func (v *boltVerifier) checkFreelist(id uint64) error {
	page, err := v.readPage(id, "freelist")
	if err != nil {
		return err
	}
	if flags := boltEndian.Uint16(page[8:]); flags != boltFreelistPage {
		return fmt.Errorf("freelist: page %d has type %#x", id, flags)
	}
	count, start := uint64(boltEndian.Uint16(page[10:])), boltPageHeaderSize
	if count == 0xFFFF {
		// The real count is the first element.
		count, start = boltEndian.Uint64(page[boltPageHeaderSize:]), boltPageHeaderSize+8
	}
	if count > uint64(len(page)-start)/8 {
		return fmt.Errorf("freelist: %d free pages do not fit page %d", count, id)
	}
	free := make(map[uint64]bool, count)
	for i := range count {
		fid := boltEndian.Uint64(page[start+int(i)*8:])
		switch {
		case fid < 2 || fid >= v.hwm:
			return fmt.Errorf("freelist: free page %d outside the file's %d pages", fid, v.hwm)
		case free[fid]:
			return fmt.Errorf("freelist: page %d listed twice", fid)
		case v.seen[fid]:
			return fmt.Errorf("freelist: page %d is free and in use", fid)
		}
		free[fid] = true
	}
	return nil
}
