package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// TestMain lets the test binary be its own children, as the command is.
func TestMain(m *testing.M) {
	if isChild(os.Args[1:]) {
		if err := runChild(os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestTransports runs every transport with 20 connections at 20 requests a
// second, their sends spread evenly (slot 0) and in 10 ms slots (5 slots
// of 4 connections each period), for a 2 s window each, and checks that
// each server answered what the clients sent, that the clients received
// it, and that the CPU was measured.
func TestTransports(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes for about 25 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	args := []string{"-conns", "20", "-rate", "20", "-slots", "0,10ms", "-warmup", "1s", "-window", "2s", "-rounds", "1", "-o", "json"}
	if err := run(ctx, args, &out, &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	slots := []float64{0, 10}
	n := len(transports) * len(slots)
	if len(rep.Rounds) != n || len(rep.Summary) != n {
		t.Fatalf("%d rounds and %d summaries, want %d of each", len(rep.Rounds), len(rep.Summary), n)
	}
	for i, r := range rep.Rounds {
		tr, slot := transports[i/len(slots)], slots[i%len(slots)]
		if r.Transport != tr || r.SlotMs != slot || rep.Summary[i].Transport != tr || rep.Summary[i].SlotMs != slot {
			t.Errorf("round %d measured %q with slot %v ms (summary %q, %v ms), want %q, %v ms",
				i, r.Transport, r.SlotMs, rep.Summary[i].Transport, rep.Summary[i].SlotMs, tr, slot)
		}
		// 400 a second expected; the machine is shared, so a fifth either
		// way (a server that answers nothing, or twice, fails).
		if r.Expected != 400 || r.AnsweredPerS < 320 || r.AnsweredPerS > 480 {
			t.Errorf("%s: answered %.0f/s of %.0f", r.Transport, r.AnsweredPerS, r.Expected)
		}
		// The two sides' counters are read one after the other: they
		// differ by the messages of that instant at most.
		if d := int64(r.ClientAnswered) - int64(r.Answered); d < -40 || d > 40 {
			t.Errorf("%s: clients received %d answers, the server answered %d", r.Transport, r.ClientAnswered, r.Answered)
		}
		// A connection has at most one request in flight at each sample:
		// the window's sends and answers differ by at most one each.
		if d := int64(r.ClientSent) - int64(r.ClientAnswered); d < -20 || d > 20 {
			t.Errorf("%s: clients sent %d, received %d", r.Transport, r.ClientSent, r.ClientAnswered)
		}
		if r.ServerMsPerMsg <= 0 || r.ClientMsPerMsg <= 0 || r.ServerReadCalls <= 0 || r.ServerWriteCalls <= 0 || r.ServerSlices <= 0 || r.ServerRSSMB <= 0 {
			t.Errorf("%s: not measured: %+v", r.Transport, r)
		}
	}
	if t.Failed() {
		t.Log(log.String())
	}
}

func TestFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Conns != 1000 || o.Rate != 1 || o.Window != 20*time.Second || o.Rounds != 3 || o.Format != "table" ||
		strings.Join(o.Transports, ",") != "raw,raw-tls,grpc,grpc-tls" {
		t.Fatalf("defaults %+v", o)
	}
	if o, err = parseFlags([]string{"-transports", "grpc, raw,grpc", "-conns", "1", "-client-procs", "4"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.Transports, ",") != "grpc,raw" || o.ClientProcs != 1 {
		t.Fatalf("%+v", o)
	}
	for _, bad := range [][]string{
		{"-conns", "0"}, {"-rate", "0"}, {"-rate", "NaN"}, {"-window", "1ms"}, {"-rounds", "0"},
		{"-transports", "quic"}, {"-o", "csv"}, {"-client-procs", "0"}, {"extra"},
	} {
		if _, err := parseFlags(bad, io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
}

func TestSlotFlag(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Slots, []time.Duration{0}) {
		t.Errorf("default slots %v, want [0]", o.Slots)
	}
	ms := time.Millisecond
	for _, tc := range []struct {
		args []string
		want []time.Duration
	}{
		{[]string{"-slots", "0,20ms,100ms"}, []time.Duration{0, 20 * ms, 100 * ms}},
		{[]string{"-slots", " 100ms, 0 ,100ms,20ms"}, []time.Duration{100 * ms, 0, 20 * ms}},
		{[]string{"-slots", "1ms,500ms"}, []time.Duration{ms, 500 * ms}},         // the bounds at -rate 1
		{[]string{"-rate", "10", "-slots", "50ms"}, []time.Duration{50 * ms}},    // half of a 100 ms period
		{[]string{"-rate", "0.5", "-slots", "1s"}, []time.Duration{time.Second}}, // a 2 s period
		{[]string{"-slots", "0s"}, []time.Duration{0}},
	} {
		o, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if !slices.Equal(o.Slots, tc.want) {
			t.Errorf("%v: slots %v, want %v", tc.args, o.Slots, tc.want)
		}
		// Each transport with each slot, transport by transport.
		vs := o.variants()
		if len(vs) != len(o.Transports)*len(tc.want) || vs[0] != (variant{transport: "raw", slot: tc.want[0]}) ||
			vs[len(vs)-1] != (variant{transport: "grpc-tls", slot: tc.want[len(tc.want)-1]}) {
			t.Errorf("%v: variants %v", tc.args, vs)
		}
	}
	for _, bad := range [][]string{
		{"-slots", ""}, {"-slots", "20"}, {"-slots", "fast"}, {"-slots", "0,,20ms"}, {"-slots", "-20ms"},
		{"-slots", "999us"}, {"-slots", "501ms"}, {"-slots", "0,1s"}, {"-rate", "10", "-slots", "51ms"},
	} {
		_, err := parseFlags(bad, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "-slots") {
			t.Errorf("%v: %v, want a usage error naming -slots", bad, err)
		}
	}
}

// TestSendOffset checks when each connection sends within a period: spread
// evenly with slot 0; with a slot, at the start of the slot its even time
// falls in, in the same order, every slot of the period used.
func TestSendOffset(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		n            int
		period, slot time.Duration
		perSlot      []int // connections sending at each slot's start (slot > 0)
	}{
		{n: 1000, period: time.Second},
		{n: 7, period: time.Second},
		{n: 1, period: time.Second},
		{n: 1000, period: time.Second, slot: 20 * ms, perSlot: slices.Repeat([]int{20}, 50)},
		{n: 1000, period: time.Second, slot: 100 * ms, perSlot: slices.Repeat([]int{100}, 10)},
		{n: 1000, period: time.Second, slot: 300 * ms, perSlot: []int{300, 300, 300, 100}},
		{n: 10, period: time.Second, slot: 20 * ms, perSlot: slices.Repeat([]int{1}, 10)},
		{n: 20, period: 50 * ms, slot: 10 * ms, perSlot: slices.Repeat([]int{4}, 5)},
	} {
		name := fmt.Sprintf("%d connections, period %v, slot %v", tc.n, tc.period, tc.slot)
		count := map[time.Duration]int{}
		prev := time.Duration(-1)
		for i := range tc.n {
			got := sendOffset(i, tc.n, tc.period, tc.slot)
			even := tc.period * time.Duration(i) / time.Duration(tc.n)
			if got < 0 || got >= tc.period || got < prev {
				t.Fatalf("%s: connection %d sends at %v, after %v, outside the period or out of order", name, i, got, prev)
			}
			prev = got
			if tc.slot == 0 {
				if got != even {
					t.Fatalf("%s: connection %d sends at %v, want %v", name, i, got, even)
				}
				continue
			}
			if got%tc.slot != 0 || got > even || even-got >= tc.slot {
				t.Fatalf("%s: connection %d sends at %v, want the start of the %v slot that holds %v", name, i, got, tc.slot, even)
			}
			count[got]++
		}
		if tc.slot == 0 {
			// Evenly: consecutive connections a period/n apart, to a nanosecond.
			if tc.n > 1 {
				step := tc.period / time.Duration(tc.n)
				for i := 1; i < tc.n; i++ {
					d := sendOffset(i, tc.n, tc.period, 0) - sendOffset(i-1, tc.n, tc.period, 0)
					if d < step || d > step+1 {
						t.Fatalf("%s: connections %d and %d %v apart, want %v", name, i-1, i, d, step)
					}
				}
			}
			continue
		}
		var perSlot []int
		for s := time.Duration(0); s < tc.period; s += tc.slot {
			if count[s] > 0 {
				perSlot = append(perSlot, count[s])
			}
		}
		if !slices.Equal(perSlot, tc.perSlot) {
			t.Errorf("%s: %v connections at the slots' starts, want %v", name, perSlot, tc.perSlot)
		}
	}
}

// TestMessageSizes holds the raw frame near the size of the grpc
// transports' messages, so that they compare like with like.
func TestMessageSizes(t *testing.T) {
	req, ans := proto.Size(renewal(1000)), proto.Size(&waldenv1.RenewLeasesResponse{Seq: 1000, Grant: grant()})
	for _, n := range []int{req, ans} {
		if n < frameSize/2 || n > frameSize*3/2 {
			t.Errorf("a protobuf message of %d bytes, a raw frame of %d", n, frameSize)
		}
	}
	f := requestFrame(42)
	if len(f) != frameSize {
		t.Fatalf("frame of %d bytes", len(f))
	}
}

func TestStatOf(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want stat
	}{
		{nil, stat{}},
		{[]float64{3, 1, 2}, stat{Median: 2, Min: 1, Max: 3}},
		{[]float64{4, 1, 2, 3}, stat{Median: 2.5, Min: 1, Max: 4}},
	} {
		if got := statOf(tc.xs); got != tc.want {
			t.Errorf("statOf(%v) = %+v, want %+v", tc.xs, got, tc.want)
		}
	}
}
