package policy_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

func TestDefaultsValid(t *testing.T) {
	p := policy.Defaults()
	if err := policy.Validate(p); err != nil {
		t.Fatalf("Validate(Defaults()) = %v", err)
	}
	want := map[string]string{
		"failure_timeout": "5s", "suspicion_quorum": "0", "lease_ttl": "3s", "restart_grace": "0s",
		"max_concurrent_recoveries": "4", "max_failed_fraction": "0.5", "cooldown": "10m", "dry_run": "false",
		"drift_margin": "500ms",
	}
	if got := len(policy.Keys()); got != len(want) {
		t.Fatalf("%d keys, want %d", got, len(want))
	}
	for _, k := range policy.Keys() {
		if got := policy.Format(p, k); got != want[k] {
			t.Errorf("Format(%s) = %q, want %q", k, got, want[k])
		}
	}
}

func TestSet(t *testing.T) {
	cases := []struct {
		key, value string
		want       string // formatted value after Set; "" when refused
		wantErr    error
		errHas     string
	}{
		{"failure_timeout", "7s", "7s", nil, ""},
		{"failure_timeout", "1500ms", "1500ms", nil, ""},
		{"failure_timeout", " 2m ", "2m", nil, ""},
		{"failure_timeout", "5", "", policy.ErrInvalid, "failure_timeout"},
		{"failure_timeout", "0s", "", policy.ErrInvalid, "must be positive"},
		{"failure_timeout", "1500us", "", policy.ErrInvalid, "finer than a millisecond"},
		{"lease_ttl", "299ms", "", policy.ErrInvalid, "at least 300ms"},
		{"lease_ttl", "300ms", "300ms", nil, ""},
		{"restart_grace", "-1s", "", policy.ErrInvalid, "must not be negative"},
		{"restart_grace", "30s", "30s", nil, ""},
		{"suspicion_quorum", "2", "2", nil, ""},
		{"suspicion_quorum", "-1", "", policy.ErrInvalid, "non-negative integer"},
		{"max_concurrent_recoveries", "0", "", policy.ErrInvalid, "at least 1"},
		{"max_concurrent_recoveries", "16", "16", nil, ""},
		{"max_failed_fraction", "0", "", policy.ErrInvalid, "greater than 0"},
		{"max_failed_fraction", "1.5", "", policy.ErrInvalid, "at most 1"},
		{"max_failed_fraction", "NaN", "", policy.ErrInvalid, "greater than 0"},
		{"max_failed_fraction", "x", "", policy.ErrInvalid, "not a number"},
		{"max_failed_fraction", "1", "1", nil, ""},
		{"cooldown", "0s", "0s", nil, ""},
		{"cooldown", "1h", "1h", nil, ""},
		{"dry_run", "true", "true", nil, ""},
		{"dry_run", "yes", "", policy.ErrInvalid, "boolean"},
		{"drift_margin", "1s", "1s", nil, ""},
		{"failure_timeut", "5s", "", policy.ErrUnknownKey, "failure_timeut"},
	}
	for _, c := range cases {
		t.Run(c.key+"="+c.value, func(t *testing.T) {
			p := policy.Defaults()
			before := proto.Clone(p)
			err := policy.Set(p, c.key, c.value)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("Set = %v, want %v containing %q", err, c.wantErr, c.errHas)
				}
				if !proto.Equal(p, before) {
					t.Fatalf("refused Set changed the policy: %v", p)
				}
				return
			}
			if err != nil {
				t.Fatalf("Set = %v", err)
			}
			if got := policy.Format(p, c.key); got != c.want {
				t.Fatalf("Format = %q, want %q", got, c.want)
			}
			canon, err := policy.Canonical(c.key, c.value)
			if err != nil || canon != c.want {
				t.Fatalf("Canonical = %q, %v", canon, err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(p *waldenv1.Policy)
		wantKey string // "" when valid
	}{
		{"defaults", func(*waldenv1.Policy) {}, ""},
		{"failure_timeout equal to lease_ttl + drift", func(p *waldenv1.Policy) { p.FailureTimeoutMs = 3500 }, "failure_timeout"},
		{"failure_timeout just above", func(p *waldenv1.Policy) { p.FailureTimeoutMs = 3501 }, ""},
		{"failure_timeout below lease_ttl", func(p *waldenv1.Policy) { p.FailureTimeoutMs = 1000 }, "failure_timeout"},
		{"big drift margin", func(p *waldenv1.Policy) { p.DriftMarginMs = 2500 }, "failure_timeout"},
		{"short lease", func(p *waldenv1.Policy) { p.LeaseTtlMs = 100 }, "lease_ttl"},
		{"fraction zero", func(p *waldenv1.Policy) { p.MaxFailedFraction = 0 }, "max_failed_fraction"},
		{"fraction above one", func(p *waldenv1.Policy) { p.MaxFailedFraction = 1.01 }, "max_failed_fraction"},
		{"no recoveries", func(p *waldenv1.Policy) { p.MaxConcurrentRecoveries = 0 }, "max_concurrent_recoveries"},
		{"negative cooldown", func(p *waldenv1.Policy) { p.CooldownMs = -1 }, "cooldown"},
		{"negative grace", func(p *waldenv1.Policy) { p.RestartGraceMs = -1 }, "restart_grace"},
		{"negative drift", func(p *waldenv1.Policy) { p.DriftMarginMs = -1 }, "drift_margin"},
		{"tuned", func(p *waldenv1.Policy) { p.FailureTimeoutMs, p.LeaseTtlMs, p.DriftMarginMs = 1500, 900, 200 }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := policy.Defaults()
			c.mutate(p)
			err := policy.Validate(p)
			if c.wantKey == "" {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			var ke *policy.KeyError
			if !errors.As(err, &ke) || ke.Key != c.wantKey || !errors.Is(err, policy.ErrInvalid) {
				t.Fatalf("Validate = %v, want a KeyError for %s", err, c.wantKey)
			}
			if !strings.Contains(err.Error(), c.wantKey) {
				t.Fatalf("message %q does not name %s", err, c.wantKey)
			}
		})
	}
	if err := policy.Validate(nil); !errors.Is(err, policy.ErrInvalid) {
		t.Fatalf("Validate(nil) = %v", err)
	}
}

func TestEffective(t *testing.T) {
	cfg := policy.Defaults()
	cfg.CooldownMs = 60_000
	ov := &waldenv1.PolicyOverrides{
		Values:   map[string]string{"failure_timeout": "8s", "dry_run": "true", "lease_ttl": "bogus"},
		SetIndex: map[string]uint64{"failure_timeout": 12, "dry_run": 14, "lease_ttl": 15},
	}
	eff, entries := policy.Effective(cfg, ov)
	if eff.FailureTimeoutMs != 8000 || !eff.DryRun || eff.CooldownMs != 60_000 || eff.LeaseTtlMs != 3000 {
		t.Fatalf("effective = %v", eff)
	}
	got := map[string]*waldenv1.PolicyEntry{}
	for i, e := range entries {
		if e.GetKey() != policy.Keys()[i] {
			t.Fatalf("entry %d is %s, want %s", i, e.GetKey(), policy.Keys()[i])
		}
		got[e.GetKey()] = e
	}
	for key, want := range map[string]struct {
		value, source string
		index         uint64
	}{
		"failure_timeout": {"8s", "runtime", 12}, "dry_run": {"true", "runtime", 14},
		"cooldown": {"1m", "seed", 0}, "lease_ttl": {"3s", "default", 0}, "max_failed_fraction": {"0.5", "default", 0},
	} {
		e := got[key]
		if e.GetValue() != want.value || e.GetSource() != want.source || e.GetSetIndex() != want.index {
			t.Errorf("%s = %v, want %+v", key, e, want)
		}
	}
	eff, _ = policy.Effective(nil, nil)
	if !proto.Equal(eff, policy.Defaults()) {
		t.Fatalf("Effective(nil, nil) = %v", eff)
	}
}

func TestFromValues(t *testing.T) {
	p, err := policy.FromValues(map[string]string{"failure_timeout": "2s", "lease_ttl": "1s", "drift_margin": "200ms", "dry_run": "true"})
	if err != nil || p.FailureTimeoutMs != 2000 || p.LeaseTtlMs != 1000 || !p.DryRun || p.CooldownMs != 600_000 {
		t.Fatalf("FromValues = %v, %v", p, err)
	}
	for _, c := range []struct {
		values map[string]string
		want   error
		has    string
	}{
		{map[string]string{"failure_timeout": "3s"}, policy.ErrInvalid, "failure_timeout: must be greater than lease_ttl + drift_margin"},
		{map[string]string{"lease_tt": "3s"}, policy.ErrUnknownKey, "lease_tt"},
		{map[string]string{"cooldown": "-1m"}, policy.ErrInvalid, "cooldown"},
	} {
		if _, err := policy.FromValues(c.values); !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.has) {
			t.Errorf("FromValues(%v) = %v, want %v saying %q", c.values, err, c.want, c.has)
		}
	}
}

func TestValidateDriftCoversLeaseTTL(t *testing.T) {
	p := policy.Defaults()
	p.LeaseTtlMs, p.DriftMarginMs, p.FailureTimeoutMs = 20000, 40, 30000
	var ke *policy.KeyError
	if err := policy.Validate(p); !errors.As(err, &ke) || ke.Key != policy.KeyDriftMargin {
		t.Fatalf("drift_margin 40ms for a 20s lease: %v", err)
	}
	p.DriftMarginMs = 41
	if err := policy.Validate(p); err != nil {
		t.Fatal(err)
	}
}

func TestDrift(t *testing.T) {
	seed := policy.Defaults()
	cfg := policy.Defaults()
	cfg.LeaseTtlMs = 20000
	if got := policy.Drift(cfg, seed); len(got) != 1 || got[0] != policy.KeyLeaseTTL {
		t.Fatalf("policy.Drift = %v", got)
	}
	if got := policy.Drift(cfg, nil); got != nil {
		t.Fatalf("policy.Drift before the seed = %v", got)
	}
}
