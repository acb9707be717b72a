package protocol_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"walden/automq/protocol"
	"walden/internal/testutil"
)

// TestEveryAutoMQCodeIsNamed: AutoMQ 1.4.1's range 501–516 and 599 and
// NOT_CONTROLLER each have a named error with a sentence.
func TestEveryAutoMQCodeIsNamed(t *testing.T) {
	want := []int16{41, 599}
	for c := int16(501); c <= 516; c++ {
		want = append(want, c)
	}
	for _, code := range want {
		named := protocol.LookupCode(code)
		if named == nil || named.Name == "" || len(named.Meaning) < 30 || named.APIs == "" {
			t.Fatalf("code %d has no named error with a meaning", code)
		}
		err := protocol.ItemError(protocol.KeyCloseStreams, code, "stream 42")
		if !errors.Is(err, named) {
			t.Fatalf("errors.Is(%v, %s) is false", err, named.Name)
		}
		var api *protocol.APIError
		if !errors.As(err, &api) || api.API != protocol.KeyCloseStreams || api.Code != code || api.Retriable() != named.Retriable {
			t.Fatalf("%v: %+v", err, api)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, fmt.Sprintf("CloseStreams answered %s (%d) for stream 42: ", named.Name, code)) {
			t.Fatalf("message %q", msg)
		}
	}
	if protocol.LookupCode(0) != nil || protocol.ErrorForCode(protocol.KeyOpenStreams, 0) != nil {
		t.Fatal("code 0 is an error")
	}
}

func TestKafkaAndUnknownCodes(t *testing.T) {
	err := protocol.ErrorForCode(protocol.KeyCommitStreamSetObject, 41)
	if !errors.Is(err, protocol.ErrNotController) || !errors.Is(err, kerr.NotController) || errors.Is(err, kerr.RequestTimedOut) {
		t.Fatalf("NOT_CONTROLLER: %v", err)
	}
	// A Kafka code without a name of this package is kerr's.
	err = protocol.ErrorForCode(protocol.KeyOpenStreams, kerr.SaslAuthenticationFailed.Code)
	var api *protocol.APIError
	if !errors.Is(err, kerr.SaslAuthenticationFailed) || !errors.As(err, &api) || api.Name() != "SASL_AUTHENTICATION_FAILED" {
		t.Fatalf("kerr code: %v", err)
	}
	err = protocol.ErrorForCode(protocol.KeyGetOpeningStreams, kerr.CoordinatorLoadInProgress.Code)
	if !errors.As(err, &api) || !api.Retriable() {
		t.Fatalf("kerr's retriable flag is lost: %v", err)
	}
	// A code nobody defines.
	err = protocol.ErrorForCode(protocol.KeyGetOpeningStreams, 777)
	if !errors.Is(err, protocol.ErrUnknownCode) || !errors.As(err, &api) || api.Retriable() || api.Name() != "UNKNOWN" ||
		!strings.Contains(err.Error(), "GetOpeningStreams answered UNKNOWN (777): a code that neither AutoMQ 1.4.1 nor Kafka defines") {
		t.Fatalf("unknown code: %v", err)
	}
	if errors.Is(err, kerr.UnknownServerError) {
		t.Fatal("an unknown code reads as UNKNOWN_SERVER_ERROR")
	}
}

func TestCodesTableInDocs(t *testing.T) {
	seen := map[int16]bool{}
	for _, c := range protocol.Codes() {
		if seen[c.Code] {
			t.Fatalf("code %d twice", c.Code)
		}
		seen[c.Code] = true
	}
	testutil.GeneratedSection(t, "../../docs/automq-protocol.md", "error codes", "automq/protocol", protocol.MarkdownTable())
}
