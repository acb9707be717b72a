package detect

import (
	"fmt"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
)

// BenchmarkDecide is one decision of the leader over a fleet of healthy
// brokers, each observed alive by the three voters, with the memory of the
// decision before it: what the leader pays every 150 ms.
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprintf("brokers=%d", n), func(b *testing.B) {
			brokers := make([]*waldenv1.Broker, n)
			for i := range brokers {
				br := &waldenv1.Broker{BrokerId: fmt.Sprintf("b%05d", i), Epoch: 1, BrokerState: waldenv1.BrokerState_BROKER_STATE_ALIVE, RecoveredWalOffset: -1}
				for j, v := range voters {
					br.Observations = append(br.Observations, &waldenv1.Observation{ObserverId: v, Epoch: 1,
						ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_ALIVE, Index: uint64(10 + 3*i + j)})
				}
				brokers[i] = br
			}
			now := time.Unix(1_800_000_000, 0)
			in := Input{Now: now, NowUnixMs: now.UnixMilli(), LeaderSince: now.Add(-time.Minute), LeaderID: "c1", Term: 2,
				Policy: testPolicy(), Voters: voters, LiveMembers: voters, Brokers: brokers}
			in.Memory = Decide(in).Memory
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d := Decide(in)
				if len(d.Declare) != 0 {
					b.Fatal("a healthy broker declared failed")
				}
				in.Memory = d.Memory
			}
		})
	}
}
