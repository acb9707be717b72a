package coordclient

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestLeaderHintRoundTrip(t *testing.T) {
	err := NotLeader(context.Background(), "c2", "127.0.0.2:7001")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("code = %v, want Unavailable", status.Code(err))
	}
	if id, addr := LeaderHint(status.Convert(err)); id != "c2" || addr != "127.0.0.2:7001" {
		t.Fatalf("LeaderHint = %q %q", id, addr)
	}
	if got := LeaderAddr(err, nil); got != "127.0.0.2:7001" {
		t.Fatalf("LeaderAddr(detail) = %q", got)
	}
	md := metadata.Pairs(TrailerLeaderAddr, "127.0.0.3:7001")
	if got := LeaderAddr(status.Error(codes.Unavailable, "x"), md); got != "127.0.0.3:7001" {
		t.Fatalf("LeaderAddr(trailer) = %q", got)
	}
	if got := LeaderAddr(errors.New("plain"), nil); got != "" {
		t.Fatalf("LeaderAddr(plain) = %q", got)
	}
}

// TestDoFollowsHintAndPrefers: the first endpoint is a follower naming the
// leader, which the next attempt asks; the next call starts at the leader.
func TestDoFollowsHintAndPrefers(t *testing.T) {
	c := New([]string{"127.0.0.1:1", "127.0.0.1:2"}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer c.Close()
	var asked []string
	fn := func(ctx context.Context, conn *grpc.ClientConn, _ ...grpc.CallOption) error {
		asked = append(asked, conn.Target())
		if conn.Target() == "127.0.0.1:3" {
			return nil
		}
		return NotLeader(ctx, "c3", "127.0.0.1:3")
	}
	if err := c.Do(context.Background(), Policy{PerTry: time.Second}, fn); err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.1:1", "127.0.0.1:3"}; !slices.Equal(asked, want) {
		t.Fatalf("asked %v, want %v", asked, want)
	}
	asked = nil
	if err := c.Do(context.Background(), Policy{PerTry: time.Second}, fn); err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.1:3"}; !slices.Equal(asked, want) {
		t.Fatalf("second call asked %v, want %v", asked, want)
	}
}

// TestDoRefusalAndNoAnswer: a refusal is returned as is; when every member
// is unavailable the error lists each attempt.
func TestDoRefusalAndNoAnswer(t *testing.T) {
	c := New([]string{"127.0.0.1:1", "127.0.0.1:2"}, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer c.Close()
	refusal := status.Error(codes.FailedPrecondition, "NODE_FENCED: x")
	err := c.Do(context.Background(), Policy{PerTry: time.Second}, func(ctx context.Context, conn *grpc.ClientConn, _ ...grpc.CallOption) error {
		if conn.Target() == "127.0.0.1:2" {
			return refusal
		}
		return status.Error(codes.Unavailable, "down")
	})
	if err != refusal {
		t.Fatalf("err = %v, want the refusal", err)
	}
	err = c.Do(context.Background(), Policy{PerTry: time.Second, MaxAttempts: 1}, func(context.Context, *grpc.ClientConn, ...grpc.CallOption) error {
		return status.Error(codes.Unavailable, "down")
	})
	var na *NoAnswerError
	if !errors.As(err, &na) || !errors.Is(err, ErrNoAnswer) || len(na.Failures) != 1 || na.Last().Addr != "127.0.0.1:2" {
		t.Fatalf("err = %v, want one failure at the preferred member", err)
	}
	if status.Code(na.Last().Err) != codes.Unavailable {
		t.Fatalf("last = %v", na.Last().Err)
	}
}
