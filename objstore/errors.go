package objstore

import "errors"

// Errors returned by the package, wrapped with the operation, bucket and
// key; test for them with errors.Is.
var (
	// ErrNotFound means the object (or the bucket) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalidConfig means a Config or Options value is unusable; the
	// message names the key.
	ErrInvalidConfig = errors.New("invalid s3 config")
	// ErrShortBody means an upload's body held fewer or more bytes than the
	// size given; nothing is left under the key.
	ErrShortBody = errors.New("body size differs from the declared size")
)
