package main

import (
	"fmt"
	"os"
	"sort"
	"time"

	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"walden/raftnode"
)

func main() {
	n := 3000
	dir, _ := os.MkdirTemp("/tmp/rl", "zzwal")
	defer os.RemoveAll(dir)
	data := make([]byte, 300)
	for round := 0; round < 3; round++ {
		// etcd
		w, err := wal.Create(zap.NewNop(), dir+fmt.Sprintf("/etcd%d", round), nil)
		if err != nil {
			panic(err)
		}
		var ds []time.Duration
		for i := 1; i <= n; i++ {
			e := &raftpb.Entry{Index: new(uint64(i)), Term: new(uint64(1)), Data: data}
			t := time.Now()
			if err := w.Save(&raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(uint64(i - 1))}, []*raftpb.Entry{e}); err != nil {
				panic(err)
			}
			ds = append(ds, time.Since(t))
		}
		w.Close()
		report("etcd wal", ds)
		s, err := raftnode.OpenStorage(dir+fmt.Sprintf("/walden%d", round), "x", "n1", nil)
		if err != nil {
			panic(err)
		}
		ds = ds[:0]
		for i := 1; i <= n; i++ {
			e := &raftpb.Entry{Index: new(uint64(i)), Term: new(uint64(1)), Data: data}
			t := time.Now()
			if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(uint64(i - 1))}, []*raftpb.Entry{e}, nil); err != nil {
				panic(err)
			}
			ds = append(ds, time.Since(t))
		}
		s.Close()
		report("walden", ds)
	}
}

func report(name string, ds []time.Duration) {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	fmt.Printf("%-10s mean %v p50 %v p90 %v p99 %v\n", name, sum/time.Duration(len(ds)), ds[len(ds)/2], ds[len(ds)*9/10], ds[len(ds)*99/100])
}
