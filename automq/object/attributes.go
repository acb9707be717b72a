package object

import (
	"fmt"
	"math"
)

// ObjectType is the kind of an object, in bits 0-1 of its attributes.
type ObjectType uint8

const (
	// TypeNormal is an object with its own data blocks (every object this
	// package writes).
	TypeNormal ObjectType = 0
	// TypeComposite is an object whose index points into other objects;
	// AutoMQ reads it with another reader.
	TypeComposite ObjectType = 1
)

// String names the type as AutoMQ does.
func (t ObjectType) String() string {
	switch t {
	case TypeNormal:
		return "normal"
	case TypeComposite:
		return "composite"
	default:
		return fmt.Sprintf("unknown(%d)", uint8(t))
	}
}

// AttributesUnset is AutoMQ's value for attributes that were not set.
const AttributesUnset int32 = -1

const (
	attrTypeMask    = 0x3
	attrBucketShift = 2
	attrBucketMask  = 0xFFFF
	attrDeepDelete  = 1 << 18
	attrDefined     = attrTypeMask | attrBucketMask<<attrBucketShift | attrDeepDelete
	// MaxBucket is the largest bucket index attributes hold (AutoMQ keeps it
	// in a Java short).
	MaxBucket = math.MaxInt16
)

// Attributes are an object's attributes (AutoMQ's ObjectAttributes), which
// the controller records with the object (S3ObjectMetadata, and
// CommitStreamSetObject v1's Attributes fields): bits 0-1 the type, bits
// 2-17 the index of the bucket the object is stored in, bit 18 the
// deep-delete mark; bits 19-31 are unused. The zero value is a normal
// object in bucket 0, which encodes as 0.
type Attributes struct {
	// Type is the object's type.
	Type ObjectType
	// Bucket is the index of the object's bucket among the cluster's data
	// buckets, 0 to MaxBucket.
	Bucket int
	// DeepDelete marks an object whose deletion must also delete what it
	// refers to.
	DeepDelete bool
}

// Encode returns the attributes as the int32 AutoMQ sends: 4 for bucket 1,
// 12 for bucket 3, 262153 for a composite object in bucket 2 with the
// deep-delete mark. An unknown type or a bucket outside 0-MaxBucket is
// ErrInvalidAttributes.
func (a Attributes) Encode() (int32, error) {
	if a.Type != TypeNormal && a.Type != TypeComposite {
		return 0, fmt.Errorf("automq object: object type %d: %w", a.Type, ErrInvalidAttributes)
	}
	if a.Bucket < 0 || a.Bucket > MaxBucket {
		return 0, fmt.Errorf("automq object: bucket index %d, expected 0-%d: %w", a.Bucket, MaxBucket, ErrInvalidAttributes)
	}
	v := int32(a.Type) | int32(a.Bucket)<<attrBucketShift
	if a.DeepDelete {
		v |= attrDeepDelete
	}
	return v, nil
}

// DecodeAttributes reads attributes AutoMQ sent. -1 is ErrAttributesUnset;
// type 2 or 3, a bucket index above MaxBucket (AutoMQ would read it as a
// negative short) or any of bits 19-31 set is ErrInvalidAttributes.
func DecodeAttributes(v int32) (Attributes, error) {
	if v == AttributesUnset {
		return Attributes{}, fmt.Errorf("automq object: attributes %d: %w", v, ErrAttributesUnset)
	}
	if v&^attrDefined != 0 {
		return Attributes{}, fmt.Errorf("automq object: attributes %#x set bits 19-31, which AutoMQ 1.4 does not define: %w", uint32(v), ErrInvalidAttributes)
	}
	t := ObjectType(v & attrTypeMask)
	if t != TypeNormal && t != TypeComposite {
		return Attributes{}, fmt.Errorf("automq object: attributes %#x: object type %d, expected 0 (normal) or 1 (composite): %w", uint32(v), t, ErrInvalidAttributes)
	}
	b := int(v>>attrBucketShift) & attrBucketMask
	if b > MaxBucket {
		return Attributes{}, fmt.Errorf("automq object: attributes %#x: bucket index %d, expected 0-%d: %w", uint32(v), b, MaxBucket, ErrInvalidAttributes)
	}
	return Attributes{Type: t, Bucket: b, DeepDelete: v&attrDeepDelete != 0}, nil
}
