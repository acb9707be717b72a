package object

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"
)

// benchRounds is the number of rounds per payload size; every round times
// each variant once.
const benchRounds = 21

// benchInput is 64 MiB of payload in records of one size over 8 streams,
// encoded back to back in one arena as a WAL holds them; each stream's
// records are views into it, encoded and decoded.
type benchInput struct {
	ids     []int64
	encoded [][][]byte
	decoded [][]Record
	size    int64 // the object's size
}

func newBenchInput(b *testing.B, payloadLen int) *benchInput {
	const total = 64 << 20
	const streams = 8
	n := total / payloadLen / streams
	in := &benchInput{}
	arena := make([]byte, 0, streams*n*(RecordHeaderSize+payloadLen))
	payload := make([]byte, payloadLen)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for s := range streams {
		id := int64(1000 + s)
		in.ids = append(in.ids, id)
		var enc [][]byte
		var dec []Record
		for k := range n {
			r := Record{StreamID: id, Epoch: 3, BaseOffset: int64(k * 10), Count: 10, Payload: payload}
			at := len(arena)
			arena = r.AppendEncoded(arena)
			body := arena[at:len(arena):len(arena)]
			enc = append(enc, body)
			r.Payload = body[RecordHeaderSize:]
			dec = append(dec, r)
		}
		in.encoded = append(in.encoded, enc)
		in.decoded = append(in.decoded, dec)
	}
	p, _ := NewPlanner(DefaultBlockSize)
	for i, id := range in.ids {
		if err := p.WriteEncoded(id, in.encoded[i]); err != nil {
			b.Fatal(err)
		}
	}
	in.size = p.Size()
	return in
}

// benchVariant is one way of producing the object's bytes (or, for the
// planner, its layout).
type benchVariant struct {
	name string
	run  func(b *testing.B, in *benchInput, buf *bytes.Buffer)
}

var benchVariants = []benchVariant{
	{"baseline: bytes.Buffer copy of the encoded records", func(b *testing.B, in *benchInput, buf *bytes.Buffer) {
		buf.Reset()
		for _, enc := range in.encoded {
			for _, p := range enc {
				buf.Write(p)
			}
		}
	}},
	{"Writer.WriteEncoded", func(b *testing.B, in *benchInput, buf *bytes.Buffer) {
		buf.Reset()
		w, _ := NewWriter(buf, DefaultBlockSize)
		for i, id := range in.ids {
			if err := w.WriteEncoded(id, in.encoded[i]); err != nil {
				b.Fatal(err)
			}
		}
		if l, err := w.Close(); err != nil || l.Size != int64(buf.Len()) {
			b.Fatalf("close: %v, %d bytes", err, buf.Len())
		}
	}},
	{"Writer.Write (decoded records)", func(b *testing.B, in *benchInput, buf *bytes.Buffer) {
		buf.Reset()
		w, _ := NewWriter(buf, DefaultBlockSize)
		for i, id := range in.ids {
			if err := w.Write(id, in.decoded[i]); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := w.Close(); err != nil {
			b.Fatal(err)
		}
	}},
	{"Planner.WriteEncoded (no bytes)", func(b *testing.B, in *benchInput, _ *bytes.Buffer) {
		p, _ := NewPlanner(DefaultBlockSize)
		for i, id := range in.ids {
			if err := p.WriteEncoded(id, in.encoded[i]); err != nil {
				b.Fatal(err)
			}
		}
	}},
}

// BenchmarkWrite64MiB prints a table of the cost of writing a 64 MiB object
// (8 streams, the default block size) into a bytes.Buffer grown once (no
// allocation is measured), from encoded records (the recovery's path) and
// from decoded records, and of planning it, against the baseline of copying
// the same encoded records into the same buffer with one Write each. What
// the Writer adds is the checks, the block headers, the index and the
// footer. Each round times every variant once, rotating which goes first;
// the table gives, per variant, the median throughput, the p99 time
// (nearest rank: with 21 rounds, the slowest) and the median of the
// per-round ratios of time to the baseline's, with their range. Reproduce
// with
//
//	go test -run='^$' -bench=Write64MiB -benchtime=1x ./automq/object
func BenchmarkWrite64MiB(b *testing.B) {
	fmt.Printf("\nwriting a 64 MiB AutoMQ object, %d rounds, %s\n\n", benchRounds, time.Now().UTC().Format("2006-01-02"))
	fmt.Println("| payload | variant | median MB/s | p99 ms | time / baseline (median) | range |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, payloadLen := range []int{1 << 10, 16 << 10} {
		in := newBenchInput(b, payloadLen)
		var buf bytes.Buffer
		buf.Grow(int(in.size))
		times := make([][]time.Duration, len(benchVariants))
		for round := range benchRounds {
			for k := range benchVariants {
				v := (k + round) % len(benchVariants)
				start := time.Now()
				benchVariants[v].run(b, in, &buf)
				times[v] = append(times[v], time.Since(start))
			}
		}
		for v, bv := range benchVariants {
			sorted := slices.Clone(times[v])
			slices.Sort(sorted)
			med := sorted[len(sorted)/2]
			p99 := sorted[min(len(sorted)-1, (len(sorted)*99+99)/100-1)]
			var ratios []float64
			for r := range times[v] {
				ratios = append(ratios, float64(times[v][r])/float64(times[0][r]))
			}
			slices.Sort(ratios)
			ratio := fmt.Sprintf("%.2f", ratios[len(ratios)/2])
			rng := fmt.Sprintf("%.2f–%.2f", ratios[0], ratios[len(ratios)-1])
			if v == 0 {
				ratio, rng = "1", "–"
			}
			fmt.Printf("| %d KiB | %s | %.0f | %.1f | %s | %s |\n", payloadLen>>10, bv.name,
				float64(in.size)/med.Seconds()/1e6, float64(p99.Microseconds())/1000, ratio, rng)
			if v == 1 {
				b.ReportMetric(ratios[len(ratios)/2], fmt.Sprintf("encoded/baseline@%dKiB", payloadLen>>10))
			}
		}
	}
	fmt.Println()
}
