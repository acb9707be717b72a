package s3test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"walden/objstore"
)

// BenchUploadDirect uploads size bytes of random data b.N times to the S3 of
// cfg with objstore's transfer-manager Upload (parallel multipart above
// opts.PartSize), reporting bytes per second (b.SetBytes) and MiB/s. It is
// the baseline for the recovery benchmark: the same bytes uploaded straight
// to the same endpoint, without reading a WAL or committing anything.
func BenchUploadDirect(b *testing.B, cfg objstore.Config, opts objstore.Options, size int64) {
	b.Helper()
	c, err := objstore.New(context.Background(), cfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(size), 42))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		key := fmt.Sprintf("bench/direct-%d.obj", i)
		if _, err := c.Upload(ctx, key, bytes.NewReader(data), size, nil); err != nil {
			b.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(size)*float64(b.N)/elapsed.Seconds()/(1<<20), "MiB/s")
	for i := 0; i < b.N; i++ {
		_ = c.Delete(ctx, fmt.Sprintf("bench/direct-%d.obj", i))
	}
}
