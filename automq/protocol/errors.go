package protocol

import (
	"errors"
	"fmt"
)

// The errors of encoding and decoding, wrapped in a DecodeError or an
// EncodeError that says where; test for them with errors.Is.
var (
	// ErrTruncated means a frame ends before its message does: a frame cut
	// in the middle, or a length that promises more bytes than follow.
	ErrTruncated = errors.New("frame ends before the message does")
	// ErrMalformed means bytes that no AutoMQ 1.4.1 encoder writes: a null
	// where the schema allows none, a string that is not UTF-8 or too long,
	// a bool other than 0 or 1, an overlong varint, tagged fields out of
	// order, or bytes left over after the message.
	ErrMalformed = errors.New("malformed frame")
	// ErrVersion means a message version that the API does not have (or
	// that this package does not speak).
	ErrVersion = errors.New("unsupported API version")
	// ErrUnknownAPI means an API key that is neither one of the six AutoMQ
	// APIs of this package nor one of Kafka's that kmsg knows.
	ErrUnknownAPI = errors.New("unknown API key")
	// ErrFieldNotInVersion means a message holds a value other than the
	// default in a field that its version does not have (Attributes in
	// CommitStreamSetObject v0, Tags in OpenStreams v0): encoding it would
	// silently drop the value, so it is refused, as AutoMQ's own writer
	// refuses it.
	ErrFieldNotInVersion = errors.New("field not in this version")
	// ErrInvalidField means a value that the wire form cannot carry: a
	// string that is not UTF-8 or longer than 32767 bytes.
	ErrInvalidField = errors.New("value the wire form cannot carry")
	// ErrCorrelation means a response frame answers another request (its
	// correlation id is not the one sent).
	ErrCorrelation = errors.New("correlation id mismatch")
	// ErrFrameSize means a size prefix that is negative or larger than the
	// reader accepts.
	ErrFrameSize = errors.New("frame size out of range")
)

// DecodeError says where a frame could not be decoded: the message and
// version, the field (a path such as openStreamRequests[2].tags[0].key),
// the byte offset in the message body, and why. It wraps ErrTruncated,
// ErrMalformed or ErrVersion.
type DecodeError struct {
	// Message is the message's name and version, e.g. "OpenStreamsRequest v1".
	Message string
	// Field is the path of the field being read; empty for the message
	// as a whole (trailing bytes).
	Field string
	// Offset is the byte offset in the body where the field starts.
	Offset int
	// Reason says what was wrong, in words.
	Reason string
	// Err is ErrTruncated, ErrMalformed or ErrVersion.
	Err error
}

func (e *DecodeError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("automq protocol: %s: at byte %d: %s", e.Message, e.Offset, e.Reason)
	}
	return fmt.Sprintf("automq protocol: %s: %s at byte %d: %s", e.Message, e.Field, e.Offset, e.Reason)
}

// Unwrap returns the sentinel (ErrTruncated, ErrMalformed, ErrVersion).
func (e *DecodeError) Unwrap() error { return e.Err }

// EncodeError says why a message cannot be encoded: which message and
// version, which field, and why. It wraps ErrFieldNotInVersion,
// ErrInvalidField or ErrVersion.
type EncodeError struct {
	// Message is the message's name and version.
	Message string
	// Field is the path of the offending field; empty for the version.
	Field string
	// Reason says what is wrong, in words.
	Reason string
	// Err is ErrFieldNotInVersion, ErrInvalidField or ErrVersion.
	Err error
}

func (e *EncodeError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("automq protocol: cannot encode %s: %s", e.Message, e.Reason)
	}
	return fmt.Sprintf("automq protocol: cannot encode %s: %s: %s", e.Message, e.Field, e.Reason)
}

// Unwrap returns the sentinel.
func (e *EncodeError) Unwrap() error { return e.Err }
