package gossip

import "errors"

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError: a key of the
// gossip configuration has a value that is not allowed.
var ErrInvalidConfig = errors.New("gossip: invalid configuration")

// ErrEncryptionKey means the encryption key file could not be read or does not
// hold a base64 key of 16, 24 or 32 bytes. The error text names the file.
var ErrEncryptionKey = errors.New("gossip: bad encryption key file")

// ErrInvalidMeta means node metadata could not be decoded or is not valid: an
// unknown encoding version or role, a truncated field, a missing cluster name
// or id.
var ErrInvalidMeta = errors.New("gossip: invalid node metadata")

// ErrMetaTooLarge means encoded node metadata is longer than memberlist's
// limit of MetaMaxSize bytes.
var ErrMetaTooLarge = errors.New("gossip: node metadata too large")

// ErrForeignCluster is returned to memberlist to refuse a member (or a
// push/pull merge holding a member) whose metadata names another cluster, or
// carries no walden metadata at all.
var ErrForeignCluster = errors.New("gossip: member of another cluster refused")

// ErrJoin means a join contacted none of the given addresses successfully.
var ErrJoin = errors.New("gossip: join failed")

// ErrLeft is returned by UpdateMeta after Leave.
var ErrLeft = errors.New("gossip: the member has left the pool")

// ErrShutdown is returned by the methods of a Pool that has been shut down.
var ErrShutdown = errors.New("gossip: pool is shut down")
