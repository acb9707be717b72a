package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmark parameters: kept small enough for `make bench` (benchtime 1x) to
// finish in a few tens of seconds on two cores.
const (
	benchFileSize   = 128 << 20              // WAL capacity and raw file size
	benchRounds     = 7                      // rounds per measurement; medians are reported
	benchPhase      = 300 * time.Millisecond // length of one append measurement
	benchRecoverMiB = 96                     // bytes of records written for the recovery scan
	plainReadSize   = 1 << 20                // buffer of the plain sequential read baseline
)

// BenchmarkWAL prints two side-by-side tables (markdown, for the README):
//
//   - append throughput with durability: walden's Writer (group commit,
//     fdatasync before acknowledging) against raw pwrite + fdatasync of the
//     same record bytes by the same number of goroutines (each reserving its
//     own position, writing and syncing), for 1 KiB, 4 KiB and 64 KiB
//     payloads at 1 and 8 concurrent appenders;
//   - recovery scan throughput (Open, then Next over every record with both
//     CRCs checked, timed until Next returns io.EOF) against a plain
//     sequential read of the same byte range (open, then pread(2) of
//     [first, first+span) mapped onto the ring into one reused 1 MiB buffer,
//     timed until the last read returns), with the file in the page cache
//     and evicted from it. Neither side's Close is timed.
//
// Each round runs both sides back to back, alternating which goes first.
// Throughputs are medians over benchRounds rounds; the ratio is the median
// of the per-round ratios (pairing the sides of one round cancels most of
// the drift in a shared machine's load) with their range beside it.
// Reproduce with
// `go test -run='^$' -bench=BenchmarkWAL -benchtime=1x ./wal`.
func BenchmarkWAL(b *testing.B) {
	dir := b.TempDir()
	walPath := filepath.Join(dir, "bench.wal")
	rawPath := filepath.Join(dir, "bench.raw")
	prepareBenchFiles(b, walPath, rawPath)
	b.Run("append", func(b *testing.B) { benchAppendTable(b, walPath, rawPath) })
	b.Run("scan", func(b *testing.B) { benchScanTable(b, walPath) })
	fmt.Println()
}

// benchAppendTable prints the append table.
func benchAppendTable(b *testing.B, walPath, rawPath string) {
	fmt.Printf("\nappend with durability (fdatasync before ack), %d MiB files, median of %d rounds of %v\n\n",
		benchFileSize>>20, benchRounds, benchPhase)
	fmt.Println("| payload | appenders | walden MB/s | walden records/s | raw MB/s | raw records/s | walden/raw | range |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, size := range []int{1 << 10, 4 << 10, 64 << 10} {
		for _, conc := range []int{1, 8} {
			var wRates, rRates []rate
			for round := 0; round < benchRounds; round++ {
				// Alternate which side goes first, so drift in the machine's
				// load does not favour one of them.
				if round%2 == 0 {
					wRates = append(wRates, benchAppendWalden(b, walPath, size, conc))
					rRates = append(rRates, benchAppendRaw(b, rawPath, size, conc))
				} else {
					rRates = append(rRates, benchAppendRaw(b, rawPath, size, conc))
					wRates = append(wRates, benchAppendWalden(b, walPath, size, conc))
				}
			}
			ratio, lo, hi := pairedRatio(wRates, rRates)
			w, r := medianRate(wRates), medianRate(rRates)
			fmt.Printf("| %s | %d | %.1f | %.0f | %.1f | %.0f | %.2f× | %.2f–%.2f |\n",
				sizeName(size), conc, w.mbps(), w.recps(), r.mbps(), r.recps(), ratio, lo, hi)
			b.ReportMetric(ratio, fmt.Sprintf("ratio-%dKiB-c%d", size>>10, conc))
		}
	}
}

// benchScanTable prints the recovery scan table.
func benchScanTable(b *testing.B, walPath string) {
	fmt.Printf("\nrecovery scan vs sequential read of the same bytes, %d MiB of records, median of %d rounds\n\n", benchRecoverMiB, benchRounds)
	fmt.Println("| payload | cache | scan MB/s | scan records/s | read MB/s | scan/read | range |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, size := range []int{1 << 10, 64 << 10} {
		first, span, records := fillForRecovery(b, walPath, size)
		for _, cold := range []bool{false, true} {
			var sRates, rRates []rate
			for round := 0; round < benchRounds; round++ {
				if round%2 == 0 {
					rRates = append(rRates, benchSequentialRead(b, walPath, first, span, cold))
					sRates = append(sRates, benchScan(b, walPath, span, records, cold))
				} else {
					sRates = append(sRates, benchScan(b, walPath, span, records, cold))
					rRates = append(rRates, benchSequentialRead(b, walPath, first, span, cold))
				}
			}
			ratio, lo, hi := pairedRatio(sRates, rRates)
			s, r := medianRate(sRates), medianRate(rRates)
			cache := "warm"
			if cold {
				cache = "cold"
			}
			fmt.Printf("| %s | %s | %.0f | %.0f | %.0f | %.2f× | %.2f–%.2f |\n", sizeName(size), cache, s.mbps(), s.recps(), r.mbps(), ratio, lo, hi)
			b.ReportMetric(ratio, fmt.Sprintf("scan-ratio-%dKiB-%s", size>>10, cache))
		}
	}
}

// rate is bytes and records done in an elapsed time.
type rate struct {
	bytes, records int64
	elapsed        time.Duration
}

func (r rate) mbps() float64  { return float64(r.bytes) / 1e6 / r.elapsed.Seconds() }
func (r rate) recps() float64 { return float64(r.records) / r.elapsed.Seconds() }

// pairedRatio returns the median, minimum and maximum of a[i]/b[i] (MB/s),
// the two sides measured in round i. Call it before medianRate sorts them.
func pairedRatio(a, b []rate) (median, lo, hi float64) {
	rs := make([]float64, len(a))
	for i := range a {
		rs[i] = a[i].mbps() / b[i].mbps()
	}
	slices.Sort(rs)
	return rs[len(rs)/2], rs[0], rs[len(rs)-1]
}

func medianRate(rs []rate) rate {
	slices.SortFunc(rs, func(a, b rate) int {
		switch {
		case a.mbps() < b.mbps():
			return -1
		case a.mbps() > b.mbps():
			return 1
		}
		return 0
	})
	return rs[len(rs)/2]
}

func sizeName(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// prepareBenchFiles creates the WAL and the raw file and writes every byte
// of both once, so measurements see allocated, written blocks as a WAL in
// steady state does.
func prepareBenchFiles(b *testing.B, walPath, rawPath string) {
	w, err := Create(walPath, CreateOptions{Capacity: benchFileSize, NodeID: 1, NodeEpoch: 1})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	zero := make([]byte, 4<<20)
	for _, p := range []struct {
		path string
		from int64
	}{{walPath, HeaderRegionSize}, {rawPath, 0}} {
		f, err := os.OpenFile(p.path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		for off := p.from; off < benchFileSize; off += int64(len(zero)) {
			n := min(int64(len(zero)), benchFileSize-off)
			if _, err := f.WriteAt(zero[:n], off); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

func benchPayload(size int) []byte {
	p := make([]byte, size)
	for i := range p {
		p[i] = byte(i * 7)
	}
	return p
}

// benchAppendWalden reopens the WAL and runs conc appenders for benchPhase.
// An appender trims to its own record once the log is half the ring ahead of
// the trim offset, so the ring never fills.
func benchAppendWalden(b *testing.B, path string, size, conc int) rate {
	w, err := OpenWriter(path, OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	payload := benchPayload(size)
	ctx := context.Background()
	var lastTrim atomic.Int64
	lastTrim.Store(w.Header().TrimOffset)
	var records atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(benchPhase)
	for a := 0; a < conc; a++ {
		wg.Add(1)
		go func(a int) {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				off, err := w.Append(ctx, Batch{StreamID: uint64(a), Epoch: 1, BaseOffset: uint64(i), Count: 1, Payload: payload})
				if err != nil {
					b.Error(err)
					return
				}
				records.Add(1)
				if t := lastTrim.Load(); off-t > (benchFileSize-HeaderRegionSize)/2 && lastTrim.CompareAndSwap(t, off) {
					if err := w.Trim(off); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}(a)
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	n := records.Load()
	return rate{bytes: n * int64(size), records: n, elapsed: elapsed}
}

// benchAppendRaw runs conc goroutines that each reserve the next position
// for one record's bytes, pwrite them and fdatasync, for benchPhase.
func benchAppendRaw(b *testing.B, path string, size, conc int) rate {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	rec := make([]byte, RecordHeaderSize+BodyHeaderSize+size)
	copy(rec[RecordHeaderSize+BodyHeaderSize:], benchPayload(size))
	var pos, records atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(benchPhase)
	for a := 0; a < conc; a++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				at := (pos.Add(int64(len(rec))) - int64(len(rec))) % (benchFileSize - int64(len(rec)))
				if _, err := unix.Pwrite(fd, rec, at); err != nil {
					b.Error(err)
					return
				}
				if err := unix.Fdatasync(fd); err != nil {
					b.Error(err)
					return
				}
				records.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := records.Load()
	return rate{bytes: n * int64(size), records: n, elapsed: elapsed}
}

// fillForRecovery resets the WAL and writes benchRecoverMiB of records with
// large group commits. It returns the logical offset of the first record, the
// span the records occupy and their number.
func fillForRecovery(b *testing.B, path string, size int) (first, span int64, records int) {
	w, err := OpenWriter(path, OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	start := w.NextOffset()
	payload := benchPayload(size)
	group := max(1, (1<<20)/size)
	batches := make([]Batch, group)
	for total := 0; total < benchRecoverMiB<<20; total += group * size {
		for i := range batches {
			batches[i] = Batch{StreamID: uint64(i % 16), Epoch: 1, BaseOffset: uint64(records + i), Count: 1, Payload: payload}
		}
		if _, err := w.AppendAll(context.Background(), batches); err != nil {
			b.Fatal(err)
		}
		records += group
	}
	span = w.NextOffset() - start
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return start, span, records
}

// evict drops the file's pages from the page cache (they are clean).
func evict(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
}

// benchScan recovers every record of the WAL with the Reader; its rate is
// counted over the span the records occupy.
func benchScan(b *testing.B, path string, span int64, want int, cold bool) rate {
	if cold {
		evict(b, path)
	}
	start := time.Now()
	rd, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for {
		_, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		n++
	}
	elapsed := time.Since(start)
	rd.Close()
	if n != int64(want) {
		b.Fatalf("scan found %d records, want %d", n, want)
	}
	return rate{bytes: span, records: n, elapsed: elapsed}
}

// benchSequentialRead reads the same device bytes as the scan, [first,
// first+span) mapped onto the ring, with 1 MiB reads.
func benchSequentialRead(b *testing.B, path string, first, span int64, cold bool) rate {
	if cold {
		evict(b, path)
	}
	start := time.Now()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, plainReadSize)
	var total int64
	for off := first; off < first+span; {
		pos := physical(off, benchFileSize)
		n := min(int64(len(buf)), first+span-off, benchFileSize-pos)
		m, err := f.ReadAt(buf[:n], pos)
		total += int64(m)
		off += int64(m)
		if err != nil {
			b.Fatal(err)
		}
	}
	return rate{bytes: total, elapsed: time.Since(start)}
}

// BenchmarkScanWarm scans 96 MiB of records (more than the 32 MiB L3 cache
// of the benchmark machine) from the page cache, one Open + full scan +
// Close per iteration; it exists for profiling the scan
// (`go test -run='^$' -bench=BenchmarkScanWarm -cpuprofile=cpu.out ./wal`).
func BenchmarkScanWarm(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run(sizeName(size), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "scan.wal")
			w, err := Create(path, CreateOptions{Capacity: benchFileSize, NodeID: 1, NodeEpoch: 1})
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			_, span, records := fillForRecovery(b, path, size)
			b.SetBytes(span)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if n := scanCount(b, path); n != records {
					b.Fatalf("scan found %d records, want %d", n, records)
				}
			}
		})
	}
}

func scanCount(b *testing.B, path string) int {
	rd, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer rd.Close()
	n := 0
	for {
		_, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return n
		}
		if err != nil {
			b.Fatal(err)
		}
		n++
	}
}
