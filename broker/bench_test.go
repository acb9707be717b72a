package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

// BenchmarkAppend measures acknowledged appends through the gRPC API (WAL
// fdatasync included) with one producer per stream, for a few batch sizes.
func BenchmarkAppend(b *testing.B) {
	for _, c := range []struct{ streams, batch int }{{1, 1}, {4, 1}, {4, 100}} {
		b.Run(fmt.Sprintf("streams=%d/batch=%d", c.streams, c.batch), func(b *testing.B) {
			e := newEnv(b)
			var ids []uint64
			for i := 1; i <= c.streams; i++ {
				ids = append(ids, uint64(i))
			}
			cfg := e.config("b1", ids...)
			cfg.WAL.Capacity, cfg.UploadBytes, cfg.UploadInterval = 64<<20, 8<<20, 200*time.Millisecond
			br := e.start(cfg)
			waitReady(b, br)
			cl := client(b, br.Addr())
			recs := make([][]byte, c.batch)
			for i := range recs {
				recs[i] = make([]byte, 100)
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N/c.streams + 1
			for _, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < per; i++ {
						if _, err := cl.Append(context.Background(), &waldenv1.AppendRequest{StreamId: id, Records: recs}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(per*c.streams*c.batch)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
