package objstore_test

import (
	"testing"

	"walden/objstore"
	"walden/objstore/s3test"
)

// BenchmarkUploadDirect uploads 64 MiB with the transfer manager (8 MiB
// parts, 8 in parallel) to each backend: the baseline that the recovery
// benchmark compares its WAL upload throughput with.
func BenchmarkUploadDirect(b *testing.B) {
	for _, name := range []string{"fake", "versitygw"} {
		b.Run(name, func(b *testing.B) {
			cfg := s3test.Backends()[name](b)
			s3test.BenchUploadDirect(b, cfg, objstore.Options{}, 64<<20)
		})
	}
}
