package object

import (
	"fmt"
	"strconv"
	"strings"
)

// NamespacePrefix is what AutoMQ's Kafka brokers put before the cluster id
// to name their object namespace.
const NamespacePrefix = "_kafka_"

// Namespace returns the object namespace of an AutoMQ cluster:
// "_kafka_" + clusterID.
func Namespace(clusterID string) string { return NamespacePrefix + clusterID }

// Key returns the S3 key AutoMQ stores object objectID of cluster clusterID
// under:
//
//	reverse(lowercase hex of objectID, zero-padded to at least 8 digits)
//	    + "/" + "_kafka_" + clusterID + "/" + objectID in decimal
//
// The reversed hex spreads consecutive ids over key prefixes. Id 1 of
// cluster "c" is "10000000/_kafka_c/1"; ids of 2^32 and above have more than
// 8 hex digits. A negative id is ErrInvalidObjectID; an empty cluster id,
// or one holding '/', is ErrInvalidClusterID.
func Key(clusterID string, objectID int64) (string, error) {
	if clusterID == "" || strings.Contains(clusterID, "/") {
		return "", fmt.Errorf("automq object: cluster id %q: %w", clusterID, ErrInvalidClusterID)
	}
	if objectID < 0 {
		return "", fmt.Errorf("automq object: object id %d: %w", objectID, ErrInvalidObjectID)
	}
	hex := strconv.FormatInt(objectID, 16)
	if len(hex) < 8 {
		hex = strings.Repeat("0", 8-len(hex)) + hex
	}
	rev := []byte(hex)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return string(rev) + "/" + Namespace(clusterID) + "/" + strconv.FormatInt(objectID, 10), nil
}

// ParseKey returns the object id of a key of cluster clusterID, checking
// that the key is exactly what Key returns for that id; anything else is
// ErrInvalidKey.
func ParseKey(clusterID, key string) (int64, error) {
	parts := strings.Split(key, "/")
	if len(parts) != 3 {
		return 0, fmt.Errorf("automq object: key %q has %d parts, expected prefix/namespace/id: %w", key, len(parts), ErrInvalidKey)
	}
	id, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || id < 0 {
		return 0, fmt.Errorf("automq object: key %q: %q is not an object id: %w", key, parts[2], ErrInvalidKey)
	}
	want, err := Key(clusterID, id)
	if err != nil {
		return 0, err
	}
	if want != key {
		return 0, fmt.Errorf("automq object: key %q, expected %q for object %d: %w", key, want, id, ErrInvalidKey)
	}
	return id, nil
}
