package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// removingBrokers answers RemoveBroker: b9 goes, b1 owns opened streams.
type removingBrokers struct{ fakeBrokers }

func (f *removingBrokers) RemoveBroker(_ context.Context, r *waldenv1.RemoveBrokerRequest) (*waldenv1.RemoveBrokerResponse, error) {
	f.got = append(f.got, r)
	if r.GetBrokerId() == "b1" {
		err := refusal.WithMetadata(fmt.Errorf("fsm: remove broker \"b1\": it owns opened streams 101, 102: %w", refusal.ErrStreamNotClosed),
			map[string]string{"streams": "101,102"})
		return nil, rpcerr.Status(err).Err()
	}
	return &waldenv1.RemoveBrokerResponse{Broker: &waldenv1.Broker{BrokerId: r.GetBrokerId(), Epoch: 4, BrokerState: waldenv1.BrokerState_BROKER_STATE_ALIVE}}, nil
}

func TestBrokerRemove(t *testing.T) {
	f := &removingBrokers{}
	addr := serveBrokers(t, f)
	code, out, errOut := runCtl(t, "--endpoints", addr, "broker", "remove", "b9")
	if code != 0 || out != "broker b9 removed (it had epoch 4, state alive)\n" {
		t.Fatalf("remove b9 (%d): %q %q", code, out, errOut)
	}
	code, _, errOut = runCtl(t, "--endpoints", addr, "broker", "remove", "b1")
	if code != exitRefused || errOut != "waldenctl: broker b1 owns opened streams 101,102: fail it over, or stop it gracefully, before removing it\n" {
		t.Fatalf("remove b1 (%d): %q", code, errOut)
	}
	code, out, _ = runCtl(t, "--endpoints", addr, "broker", "remove", "b9", "-o", "json")
	if code != 0 || !strings.Contains(out, `"broker_id": "b9"`) {
		t.Fatalf("remove -o json (%d): %s", code, out)
	}
	if len(f.got) != 3 || f.got[0].(*waldenv1.RemoveBrokerRequest).GetBrokerId() != "b9" {
		t.Fatalf("requests %v", f.got)
	}
}
