package devcontroller

import (
	"strconv"
	"strings"
)

// ObjectKey is AutoMQ's S3 key of an object: the object id in lowercase hex,
// zero-padded to at least 8 digits and reversed, then "/_kafka_" + the
// cluster id + "/" + the id in decimal (ObjectUtils.genKey, version 0, with the namespace a broker sets).
// Example: id 1 in cluster c → "10000000/_kafka_c/1".
func ObjectKey(clusterID string, objectID int64) string {
	hex := strconv.FormatUint(uint64(objectID), 16)
	if len(hex) < 8 {
		hex = strings.Repeat("0", 8-len(hex)) + hex
	}
	rev := []byte(hex)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return string(rev) + "/_kafka_" + clusterID + "/" + strconv.FormatInt(objectID, 10)
}
