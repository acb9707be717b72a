package protocol

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxStringLen is the longest string Kafka's generated code reads or
// writes (a Java short).
const maxStringLen = 0x7fff

// The flexible encoding (KIP-482) of the six AutoMQ APIs: fixed-width
// big-endian integers, unsigned LEB128 varints, compact strings and arrays
// (length + 1, 0 for null), and a tagged-field section at the end of every
// struct.

func appendInt16(dst []byte, v int16) []byte { return binary.BigEndian.AppendUint16(dst, uint16(v)) }
func appendInt32(dst []byte, v int32) []byte { return binary.BigEndian.AppendUint32(dst, uint32(v)) }
func appendInt64(dst []byte, v int64) []byte { return binary.BigEndian.AppendUint64(dst, uint64(v)) }

func appendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 1)
	}
	return append(dst, 0)
}

func appendUvarint(dst []byte, v uint32) []byte {
	for v >= 0x80 {
		dst = append(dst, byte(v)|0x80)
		v >>= 7
	}
	return append(dst, byte(v))
}

// appendCompactString appends a non-null compact string. The caller has
// validated its length and encoding.
func appendCompactString(dst []byte, s string) []byte {
	dst = appendUvarint(dst, uint32(len(s))+1)
	return append(dst, s...)
}

// appendArrayLen appends a non-null compact array's length.
func appendArrayLen(dst []byte, n int) []byte { return appendUvarint(dst, uint32(n)+1) }

// appendTags appends a tagged-field section holding the unknown tags kept
// from decoding (none for a message built by hand: a single 0).
func appendTags(dst []byte, t *kmsg.Tags) []byte {
	dst = appendUvarint(dst, uint32(t.Len()))
	return t.AppendEach(dst)
}

func appendArray[T any](dst []byte, s []T, elem func([]byte, *T) []byte) []byte {
	dst = appendArrayLen(dst, len(s))
	for i := range s {
		dst = elem(dst, &s[i])
	}
	return dst
}

// pathElem is one step of the path to the field being read or checked: a
// field name, and an index when it is an array element.
type pathElem struct {
	name  string
	index int // -1: not an array element
}

func formatPath(path []pathElem, field string) string {
	var b strings.Builder
	for _, p := range path {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(p.name)
		if p.index >= 0 {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(p.index))
			b.WriteByte(']')
		}
	}
	if field != "" {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(field)
	}
	return b.String()
}

// reader decodes a message body. The first error sticks: every read after
// it returns a zero value, so a decoder reads straight through and checks
// the error once. It never panics and never allocates more than the input
// can hold (an array's length is checked against the bytes left before
// the array is allocated).
type reader struct {
	msg  string
	src  []byte
	off  int
	err  error
	path []pathElem
}

func newReader(msg string, version, minVersion, maxVersion int16, src []byte) *reader {
	r := &reader{msg: msg + " v" + strconv.Itoa(int(version)), src: src}
	if version < minVersion || version > maxVersion {
		r.fail("", 0, ErrVersion, "%s has versions %d to %d, not %d", msg, minVersion, maxVersion, version)
	}
	return r
}

func (r *reader) fail(field string, at int, sentinel error, format string, args ...any) {
	if r.err != nil {
		return
	}
	r.err = &DecodeError{
		Message: r.msg,
		Field:   formatPath(r.path, field),
		Offset:  at,
		Reason:  fmt.Sprintf(format, args...),
		Err:     sentinel,
	}
}

func (r *reader) left() int { return len(r.src) - r.off }

// need reports whether n more bytes are there, failing with ErrTruncated
// when they are not.
func (r *reader) need(field string, n int) bool {
	if r.err != nil {
		return false
	}
	if r.left() < n {
		r.fail(field, r.off, ErrTruncated, "needs %d bytes, the frame has %d left", n, r.left())
		return false
	}
	return true
}

func (r *reader) int8(field string) int8 {
	if !r.need(field, 1) {
		return 0
	}
	v := int8(r.src[r.off])
	r.off++
	return v
}

func (r *reader) int16(field string) int16 {
	if !r.need(field, 2) {
		return 0
	}
	v := int16(binary.BigEndian.Uint16(r.src[r.off:]))
	r.off += 2
	return v
}

func (r *reader) int32(field string) int32 {
	if !r.need(field, 4) {
		return 0
	}
	v := int32(binary.BigEndian.Uint32(r.src[r.off:]))
	r.off += 4
	return v
}

func (r *reader) int64(field string) int64 {
	if !r.need(field, 8) {
		return 0
	}
	v := int64(binary.BigEndian.Uint64(r.src[r.off:]))
	r.off += 8
	return v
}

func (r *reader) bool(field string) bool {
	at := r.off
	switch b := r.int8(field); b {
	case 0:
		return false
	case 1:
		return true
	default:
		r.fail(field, at, ErrMalformed, "a bool is 0 or 1, not %d", uint8(b))
		return false
	}
}

// uvarint reads an unsigned LEB128 varint of at most 32 bits, refusing an
// overlong encoding (one that a shorter encoding would give): Kafka's
// writers never produce one, so every frame this package accepts encodes
// back to the same bytes.
func (r *reader) uvarint(field string) uint32 {
	if r.err != nil {
		return 0
	}
	at := r.off
	var v uint32
	for i := 0; i < 5; i++ {
		if r.off >= len(r.src) {
			r.fail(field, at, ErrTruncated, "the frame ends inside a varint")
			return 0
		}
		b := r.src[r.off]
		r.off++
		if i == 4 && b > 0x0f {
			r.fail(field, at, ErrMalformed, "varint longer than 32 bits")
			return 0
		}
		v |= uint32(b&0x7f) << (7 * i)
		if b < 0x80 {
			if i > 0 && b == 0 {
				r.fail(field, at, ErrMalformed, "overlong varint (%d bytes for %d)", i+1, v)
				return 0
			}
			return v
		}
	}
	// Unreachable: the fifth byte is at most 0x0f, so the loop returned.
	r.fail(field, at, ErrMalformed, "varint longer than 32 bits")
	return 0
}

// string reads a non-nullable compact string.
func (r *reader) string(field string) string {
	at := r.off
	n := r.uvarint(field)
	if r.err != nil {
		return ""
	}
	if n == 0 {
		r.fail(field, at, ErrMalformed, "null string where the schema allows none")
		return ""
	}
	l := int(n - 1)
	if l > maxStringLen {
		r.fail(field, at, ErrMalformed, "string of %d bytes, longer than the %d Kafka allows", l, maxStringLen)
		return ""
	}
	if !r.need(field, l) {
		return ""
	}
	b := r.src[r.off : r.off+l]
	if !utf8.Valid(b) {
		r.fail(field, r.off, ErrMalformed, "string is not UTF-8")
		return ""
	}
	r.off += l
	return string(b)
}

// arrayLen reads a non-nullable compact array's length, refusing one that
// the bytes left cannot hold at minSize bytes per element.
func (r *reader) arrayLen(field string, minSize int) int {
	at := r.off
	n := r.uvarint(field)
	if r.err != nil {
		return 0
	}
	if n == 0 {
		r.fail(field, at, ErrMalformed, "null array where the schema allows none")
		return 0
	}
	count := int(n - 1)
	if count > r.left()/minSize {
		r.fail(field, at, ErrTruncated, "array of %d elements (at least %d bytes each) but %d bytes left",
			count, minSize, r.left())
		return 0
	}
	return count
}

// tags reads a tagged-field section. None of the six APIs has a tagged
// field of its own in AutoMQ 1.4.1, so every tag is kept as unknown (later
// AutoMQ versions add some) and written back unchanged. Tags must be in
// strictly ascending order, as Kafka writes them.
func (r *reader) tags(t *kmsg.Tags) {
	at := r.off
	n := r.uvarint("tagged fields")
	if r.err != nil || n == 0 {
		return
	}
	if int(n) > r.left()/2 {
		r.fail("tagged fields", at, ErrTruncated, "%d tagged fields but %d bytes left", n, r.left())
		return
	}
	var prev int64 = -1
	for i := uint32(0); i < n; i++ {
		tagAt := r.off
		tag := r.uvarint("tagged fields")
		size := r.uvarint("tagged fields")
		if r.err != nil {
			return
		}
		if int64(tag) <= prev {
			r.fail("tagged fields", tagAt, ErrMalformed, "tag %d after tag %d (tags must ascend)", tag, prev)
			return
		}
		prev = int64(tag)
		if !r.need(fmt.Sprintf("tag %d", tag), int(size)) {
			return
		}
		v := make([]byte, size)
		copy(v, r.src[r.off:])
		r.off += int(size)
		t.Set(tag, v)
	}
}

// complete fails when bytes are left after the message.
func (r *reader) complete() error {
	if r.err == nil && r.left() > 0 {
		r.fail("", r.off, ErrMalformed, "%d bytes left after the message", r.left())
	}
	return r.err
}

func (r *reader) enter(name string, index int) { r.path = append(r.path, pathElem{name, index}) }
func (r *reader) leave()                       { r.path = r.path[:len(r.path)-1] }

// readArray reads a non-nullable compact array whose elements take at
// least minSize bytes each.
func readArray[T any](r *reader, field string, minSize int, elem func(*reader, *T)) []T {
	n := r.arrayLen(field, minSize)
	if r.err != nil {
		return nil
	}
	out := make([]T, n)
	for i := range out {
		r.enter(field, i)
		elem(r, &out[i])
		r.leave()
		if r.err != nil {
			return nil
		}
	}
	return out
}

// checker validates a message before it is encoded. The first problem
// sticks.
type checker struct {
	msg     string
	version int16
	err     error
	path    []pathElem
}

func newChecker(msg string, version, minVersion, maxVersion int16) *checker {
	c := &checker{msg: msg + " v" + strconv.Itoa(int(version)), version: version}
	if version < minVersion || version > maxVersion {
		c.fail("", ErrVersion, "%s has versions %d to %d, not %d", msg, minVersion, maxVersion, version)
	}
	return c
}

func (c *checker) fail(field string, sentinel error, format string, args ...any) {
	if c.err != nil {
		return
	}
	c.err = &EncodeError{Message: c.msg, Field: formatPath(c.path, field), Reason: fmt.Sprintf(format, args...), Err: sentinel}
}

// absent refuses a field that the version does not have when it holds a
// value other than its default.
func (c *checker) absent(field string, since int16, isDefault bool, value any) {
	if c.version < since && !isDefault {
		c.fail(field, ErrFieldNotInVersion, "holds %v but the field exists from v%d on; it would be lost", value, since)
	}
}

func (c *checker) string(field, s string) {
	if len(s) > maxStringLen {
		c.fail(field, ErrInvalidField, "%d bytes, longer than the %d Kafka allows", len(s), maxStringLen)
	} else if !utf8.ValidString(s) {
		c.fail(field, ErrInvalidField, "not UTF-8")
	}
}

func (c *checker) array(field string, n int) {
	if n >= math.MaxInt32 {
		c.fail(field, ErrInvalidField, "%d elements, more than a Kafka array holds", n)
	}
}

func (c *checker) enter(name string, index int) { c.path = append(c.path, pathElem{name, index}) }
func (c *checker) leave()                       { c.path = c.path[:len(c.path)-1] }

// Tag is a key and a value: the Tags of OpenStreams v1 and of the nodes of
// AutomqGetNodes.
type Tag struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	// UnknownTags are tagged fields this package does not know, kept from
	// decoding and written back unchanged.
	UnknownTags kmsg.Tags `json:"-"`
}

// tagMinSize is the smallest encoded Tag: two empty strings and the
// tagged-field byte.
const tagMinSize = 3

func readTag(r *reader, t *Tag) {
	t.Key = r.string("key")
	t.Value = r.string("value")
	r.tags(&t.UnknownTags)
}

func appendTag(dst []byte, t *Tag) []byte {
	dst = appendCompactString(dst, t.Key)
	dst = appendCompactString(dst, t.Value)
	return appendTags(dst, &t.UnknownTags)
}

func checkTags(c *checker, field string, tags []Tag) {
	c.array(field, len(tags))
	for i := range tags {
		c.enter(field, i)
		c.string("key", tags[i].Key)
		c.string("value", tags[i].Value)
		c.leave()
	}
}
