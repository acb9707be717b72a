package controller_test

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"walden/automq/controller"
	"walden/automq/protocol"
	"walden/internal/testutil/testpki"
	"walden/mtls"
)

// tlsController starts a fake controller serving TLS with a certificate of
// a test CA, and returns the client side trusting that CA.
func tlsController(t *testing.T, sasl *fakeSASL) (*fakeController, *tls.Config) {
	t.Helper()
	pki := testpki.New(t)
	server := pki.Member(t, "controller-0")
	cert, err := tls.LoadX509KeyPair(server.CertFile, server.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := mtls.CertPool(pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := healthy(t, func(f *fakeController) {
		f.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		f.sasl = sasl
	})
	return f, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func TestTLS(t *testing.T) {
	f, clientTLS := tlsController(t, nil)
	c := newClient(t, []string{f.addr}, func(c *controller.Config) { c.TLS = clientTLS })
	if _, err := c.GetOpeningStreams(ctxFor(t, 20*time.Second), 1, 1, true); err != nil {
		t.Fatal(err)
	}

	// A CA that did not sign the controller's certificate: refused, and
	// not tried again round after round.
	other := testpki.New(t)
	pool, err := mtls.CertPool(other.CA)
	if err != nil {
		t.Fatal(err)
	}
	c = newClient(t, []string{f.addr}, func(c *controller.Config) {
		c.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		c.Attempts = 5
	})
	_, err = c.GetOpeningStreams(ctxFor(t, 20*time.Second), 1, 1, true)
	var nc *controller.NoControllerError
	if !errors.As(err, &nc) || nc.Rounds != 1 || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("wrong CA: %v", err)
	}

	// Plaintext to a TLS listener.
	c = newClient(t, []string{f.addr})
	if _, err := c.GetOpeningStreams(ctxFor(t, 20*time.Second), 1, 1, true); !errors.Is(err, controller.ErrNoController) {
		t.Fatalf("plaintext to TLS: %v", err)
	}
	if n := f.count(protocol.KeyGetOpeningStreams); n != 1 {
		t.Fatalf("%d requests reached the controller, want the one over TLS", n)
	}
}

func TestSASL(t *testing.T) {
	for _, mech := range []string{controller.SASLPlain, controller.SASLScramSHA256, controller.SASLScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			sasl := &fakeSASL{mechanism: mech, user: "walden", pass: "s3cret"}
			// SASL_PLAINTEXT.
			f, _ := healthy(t, func(f *fakeController) { f.sasl = sasl })
			c := newClient(t, []string{f.addr}, func(c *controller.Config) {
				c.SASL = controller.SASL{Mechanism: mech, Username: "walden", Password: "s3cret"}
			})
			if _, err := c.GetNodes(ctxFor(t, 20*time.Second), []int32{1}); err != nil {
				t.Fatal(err)
			}
			// A wrong password: refused by the controller, not tried again.
			c = newClient(t, []string{f.addr}, func(c *controller.Config) {
				c.SASL = controller.SASL{Mechanism: mech, Username: "walden", Password: "wrong"}
				c.Attempts = 5
			})
			_, err := c.GetNodes(ctxFor(t, 20*time.Second), []int32{1})
			var nc *controller.NoControllerError
			if !errors.Is(err, kerr.SaslAuthenticationFailed) || !errors.As(err, &nc) || nc.Rounds != 1 {
				t.Fatalf("wrong password: %v", err)
			}
			if n := f.count(protocol.KeyAutomqGetNodes); n != 1 {
				t.Fatalf("%d requests reached the controller, want the authenticated one", n)
			}
		})
	}
	// SASL_SSL.
	f, clientTLS := tlsController(t, &fakeSASL{mechanism: controller.SASLScramSHA512, user: "walden", pass: "s3cret"})
	c := newClient(t, []string{f.addr}, func(c *controller.Config) {
		c.TLS = clientTLS
		c.SASL = controller.SASL{Mechanism: controller.SASLScramSHA512, Username: "walden", Password: "s3cret"}
	})
	if _, err := c.PrepareS3Object(ctxFor(t, 20*time.Second), 1, 2, time.Minute); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := controller.DefaultConfig()
	ok.Voters = []string{"10.0.0.1:9093", "[::1]:9093", "ctrl-2.example:9093"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*controller.Config){
		"voters":    func(c *controller.Config) { c.Voters = nil },
		"voters[1]": func(c *controller.Config) { c.Voters[1] = "1@ctrl:9093" },
		"voters[2]": func(c *controller.Config) { c.Voters[2] = "ctrl" },
		"voters[0]": func(c *controller.Config) { c.Voters[0] = "ctrl:0" },
		"sasl.mechanism": func(c *controller.Config) {
			c.SASL = controller.SASL{Mechanism: "GSSAPI", Username: "u", Password: "p"}
		},
		"sasl.username":     func(c *controller.Config) { c.SASL = controller.SASL{Mechanism: "PLAIN", Password: "p"} },
		"sasl.password":     func(c *controller.Config) { c.SASL = controller.SASL{Mechanism: "SCRAM-SHA-256", Username: "u"} },
		"client_id":         func(c *controller.Config) { c.ClientID = "" },
		"dial_timeout":      func(c *controller.Config) { c.DialTimeout = 0 },
		"request_timeout":   func(c *controller.Config) { c.RequestTimeout = time.Hour },
		"attempts":          func(c *controller.Config) { c.Attempts = 0 },
		"retry_backoff":     func(c *controller.Config) { c.RetryBackoff = 0 },
		"max_retry_backoff": func(c *controller.Config) { c.MaxRetryBackoff = time.Millisecond },
	}
	for key, mod := range cases {
		c := ok
		c.Voters = append([]string(nil), ok.Voters...)
		mod(&c)
		err := c.Validate()
		var ce *controller.ConfigError
		if !errors.Is(err, controller.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Key != key {
			t.Errorf("%s: %v", key, err)
		}
		if _, err := controller.New(c); !errors.Is(err, controller.ErrInvalidConfig) {
			t.Errorf("New with a bad %s: %v", key, err)
		}
	}
	dup := ok
	dup.Voters = []string{"a:1", "a:1"}
	if err := dup.Validate(); err == nil || !strings.Contains(err.Error(), `voters[1]: "a:1" is voters[0] again`) {
		t.Fatalf("duplicate voter: %v", err)
	}
}
