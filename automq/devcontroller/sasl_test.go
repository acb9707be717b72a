package devcontroller

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sasl/scram"
)

func authenticator(t *testing.T, users map[string]string, mechs ...string) *saslAuthenticator {
	t.Helper()
	a, err := newSASLAuthenticator(&SASLConfig{Users: users, Mechanisms: mechs})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestSCRAMServer runs franz-go's SCRAM client against the server side and
// tampers with each of the client's messages.
func TestSCRAMServer(t *testing.T) {
	a := authenticator(t, map[string]string{"walden": "pw"})
	type tamper struct {
		name        string
		first       func(string) string
		final       func(string) string
		wantFailure string
	}
	cases := []tamper{
		{name: "untouched"},
		{name: "channel binding requested", first: func(m string) string { return "p=tls-unique" + strings.TrimPrefix(m, "n") }, wantFailure: "channel binding"},
		{name: "an extension", first: func(m string) string { return m + ",tokenauth=true" }, wantFailure: "without extensions"},
		{name: "an authorization id of another user", first: func(m string) string { return "n,a=root" + strings.TrimPrefix(m, "n,") }, wantFailure: "authorization id"},
		{name: "another nonce", final: func(m string) string { return strings.Replace(m, ",r=", ",r=x", 1) }, wantFailure: "nonce"},
		{name: "another channel binding", final: func(m string) string {
			return strings.Replace(m, "c="+base64.StdEncoding.EncodeToString([]byte("n,,")), "c="+base64.StdEncoding.EncodeToString([]byte("y,,")), 1)
		}, wantFailure: "channel binding"},
		{name: "a wrong proof", final: func(m string) string {
			i := strings.LastIndex(m, ",p=")
			proof, _ := base64.StdEncoding.DecodeString(m[i+3:])
			proof[0] ^= 1
			return m[:i] + ",p=" + base64.StdEncoding.EncodeToString(proof)
		}, wantFailure: "invalid credentials"},
		{name: "no proof", final: func(m string) string { return m[:strings.LastIndex(m, ",p=")] }, wantFailure: "no proof"},
	}
	for _, mech := range []string{MechanismSCRAMSHA256, MechanismSCRAMSHA512} {
		for _, tc := range cases {
			t.Run(mech+"/"+tc.name, func(t *testing.T) {
				auth := scram.Auth{User: "walden", Pass: "pw"}
				m := auth.AsSha256Mechanism()
				if mech == MechanismSCRAMSHA512 {
					m = auth.AsSha512Mechanism()
				}
				client, first, err := m.Authenticate(context.Background(), "")
				if err != nil {
					t.Fatal(err)
				}
				if tc.first != nil {
					first = []byte(tc.first(string(first)))
				}
				server := a.start(mech)
				check := func(err error) bool {
					t.Helper()
					if tc.wantFailure == "" {
						if err != nil {
							t.Fatalf("refused: %v", err)
						}
						return false
					}
					if err == nil {
						return false
					}
					if !errors.Is(err, ErrAuthentication) || !strings.Contains(err.Error(), tc.wantFailure) {
						t.Fatalf("err = %v, want %q", err, tc.wantFailure)
					}
					return true
				}
				serverFirst, done, err := server.step(first)
				if check(err) {
					return
				}
				if done {
					t.Fatal("done after the first message")
				}
				_, final, err := client.Challenge(serverFirst)
				if err != nil {
					t.Fatal(err)
				}
				if tc.final != nil {
					final = []byte(tc.final(string(final)))
				}
				serverFinal, done, err := server.step(final)
				if check(err) {
					return
				}
				if tc.wantFailure != "" {
					t.Fatalf("accepted, want %q", tc.wantFailure)
				}
				if !done || server.user() != "walden" {
					t.Fatalf("done %v user %q", done, server.user())
				}
				if ok, _, err := client.Challenge(serverFinal); err != nil || !ok {
					t.Fatalf("the client does not accept the server's signature: %v", err)
				}
				if _, _, err := server.step(final); !errors.Is(err, ErrAuthentication) {
					t.Fatalf("a third message: %v", err)
				}
			})
		}
	}
}

func TestPlainServer(t *testing.T) {
	a := authenticator(t, map[string]string{"walden": "pw"}, MechanismPlain)
	for _, tc := range []struct {
		msg  string
		ok   bool
		name string
	}{
		{"\x00walden\x00pw", true, "no authorization id"},
		{"walden\x00walden\x00pw", true, "authorization id of the same user"},
		{"root\x00walden\x00pw", false, "authorization id of another user"},
		{"\x00walden\x00pW", false, "wrong password"},
		{"\x00nobody\x00pw", false, "unknown user"},
		{"\x00walden", false, "malformed"},
	} {
		_, done, err := a.start(MechanismPlain).step([]byte(tc.msg))
		if tc.ok != (err == nil && done) {
			t.Errorf("%s: done %v err %v", tc.name, done, err)
		}
	}
	if a.accepts(MechanismSCRAMSHA256) {
		t.Error("SCRAM accepted though only PLAIN is enabled")
	}
}

func TestSASLConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg SASLConfig
		key string
	}{
		{SASLConfig{}, "sasl.users"},
		{SASLConfig{Users: map[string]string{"a": ""}}, "sasl.users"},
		{SASLConfig{Users: map[string]string{"a": "b"}, Mechanisms: []string{"GSSAPI"}}, "sasl.mechanisms"},
		{SASLConfig{Users: map[string]string{"a": "b"}, Iterations: 1000}, "sasl.iterations"},
	} {
		err := tc.cfg.Validate()
		var se *SASLConfigError
		if !errors.As(err, &se) || se.Key != tc.key || !errors.Is(err, ErrInvalidSASL) {
			t.Errorf("%+v: err = %v, want a SASLConfigError of %s", tc.cfg, err, tc.key)
		}
	}
}

func TestUnescapeSASLName(t *testing.T) {
	for in, want := range map[string]string{"plain": "plain", "a=2Cb=3Dc": "a,b=c", "=3D=2C": "=,"} {
		if got, err := unescapeSASLName(in); err != nil || got != want {
			t.Errorf("%q → %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"a=b", "a=2", "=="} {
		if _, err := unescapeSASLName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
