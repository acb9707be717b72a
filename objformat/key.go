package objformat

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Key returns the S3 key of the object holding a broker's WAL records
// [firstWAL, lastWAL] uploaded under the broker epoch epoch:
//
//	<prefix>/<broker>/<epoch, 20 digits>/<firstWAL, 20 digits>-<lastWAL, 20 digits>.obj
//
// The key is a pure function of its arguments, so a retried upload of the
// same records rewrites the same key. The broker id is path-escaped; an
// empty prefix (or one of only slashes) gives a key without a leading slash.
// Zero-padded numbers make keys sort by epoch, then WAL offset. Negative WAL
// offsets (never produced by a WAL) are written with a leading '-'.
func Key(prefix, brokerID string, epoch uint64, firstWAL, lastWAL int64) string {
	k := fmt.Sprintf("%s/%020d/%s.obj", url.PathEscape(brokerID), epoch, walRange(firstWAL, lastWAL))
	if p := strings.Trim(prefix, "/"); p != "" {
		return p + "/" + k
	}
	return k
}

// ObjectID returns the catalog object id of the same upload:
//
//	<broker>-<epoch, 20 digits>-<firstWAL, 20 digits>-<lastWAL, 20 digits>
//
// It does not depend on the prefix, so moving a bucket's prefix does not
// change object identities.
func ObjectID(brokerID string, epoch uint64, firstWAL, lastWAL int64) string {
	return fmt.Sprintf("%s-%020d-%s", url.PathEscape(brokerID), epoch, walRange(firstWAL, lastWAL))
}

func walRange(first, last int64) string {
	return fmt.Sprintf("%020d-%020d", first, last)
}

// KeyParts are the arguments Key made a key from.
type KeyParts struct {
	Broker            string
	Epoch             uint64
	FirstWAL, LastWAL int64
}

// ObjectID is the object id of the upload the key names (ObjectID).
func (p KeyParts) ObjectID() string { return ObjectID(p.Broker, p.Epoch, p.FirstWAL, p.LastWAL) }

// ParseKey reads back the arguments of the Key that made key under prefix,
// and false when key is not one Key makes (another layout, another
// prefix, another format's object): Key(prefix, parts...) == key.
func ParseKey(prefix, key string) (KeyParts, bool) {
	rest := key
	if p := strings.Trim(prefix, "/"); p != "" {
		if !strings.HasPrefix(key, p+"/") {
			return KeyParts{}, false
		}
		rest = key[len(p)+1:]
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || !strings.HasSuffix(parts[2], ".obj") {
		return KeyParts{}, false
	}
	broker, err := url.PathUnescape(parts[0])
	if err != nil || broker == "" {
		return KeyParts{}, false
	}
	name := strings.TrimSuffix(parts[2], ".obj")
	if len(parts[1]) != 20 || len(name) != 41 || name[20] != '-' {
		return KeyParts{}, false
	}
	epoch, err1 := strconv.ParseUint(parts[1], 10, 64)
	first, err2 := strconv.ParseInt(name[:20], 10, 64)
	last, err3 := strconv.ParseInt(name[21:], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return KeyParts{}, false
	}
	kp := KeyParts{Broker: broker, Epoch: epoch, FirstWAL: first, LastWAL: last}
	if Key(prefix, broker, epoch, first, last) != key {
		return KeyParts{}, false
	}
	return kp, true
}
