package objformat

import (
	"fmt"
	"net/url"
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
