package policy

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
)

// Errors of this package.
var (
	// ErrUnknownKey is returned for a key that is not a policy key.
	ErrUnknownKey = errors.New("policy: unknown key")
	// ErrInvalid is returned for a value that does not parse or is out of
	// range, and for an unsafe combination of values. The error is a
	// *KeyError naming the key.
	ErrInvalid = errors.New("policy: invalid value")
)

// KeyError is a refusal of one key's value, with the reason.
type KeyError struct {
	Key    string
	Reason string
}

func (e *KeyError) Error() string { return fmt.Sprintf("policy: %s: %s", e.Key, e.Reason) }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *KeyError) Unwrap() error { return ErrInvalid }

// The policy keys, in the config file's spelling.
const (
	KeyFailureTimeout          = "failure_timeout"
	KeySuspicionQuorum         = "suspicion_quorum"
	KeyLeaseTTL                = "lease_ttl"
	KeyRestartGrace            = "restart_grace"
	KeyMaxConcurrentRecoveries = "max_concurrent_recoveries"
	KeyMaxFailedFraction       = "max_failed_fraction"
	KeyCooldown                = "cooldown"
	KeyDryRun                  = "dry_run"
	KeyDriftMargin             = "drift_margin"
)

// Source values of a PolicyEntry.
const (
	SourceDefault = "default"
	// SourceSeed marks a value of the seed: the config file of the member
	// that founded the cluster.
	SourceSeed    = "seed"
	SourceRuntime = "runtime"
)

// MinLeaseTTL is the shortest lease_ttl accepted: the agent renews every
// lease_ttl/3 and needs room for a round trip.
const MinLeaseTTL = 300 * time.Millisecond

type kind int

const (
	kindDuration kind = iota
	kindUint
	kindFloat
	kindBool
)

type key struct {
	name string
	kind kind
	// ms, u32, f64 and b address the field of a Policy.
	ms  func(p *waldenv1.Policy) *int64
	u32 func(p *waldenv1.Policy) *uint32
	f64 func(p *waldenv1.Policy) *float64
	b   func(p *waldenv1.Policy) *bool
	// check refuses an out-of-range value of this key alone ("" accepts).
	check func(p *waldenv1.Policy) string
}

var keys = []key{
	{name: KeyFailureTimeout, kind: kindDuration, ms: func(p *waldenv1.Policy) *int64 { return &p.FailureTimeoutMs },
		check: func(p *waldenv1.Policy) string { return positive(p.FailureTimeoutMs) }},
	{name: KeySuspicionQuorum, kind: kindUint, u32: func(p *waldenv1.Policy) *uint32 { return &p.SuspicionQuorum }},
	{name: KeyLeaseTTL, kind: kindDuration, ms: func(p *waldenv1.Policy) *int64 { return &p.LeaseTtlMs },
		check: func(p *waldenv1.Policy) string {
			if time.Duration(p.LeaseTtlMs)*time.Millisecond < MinLeaseTTL {
				return fmt.Sprintf("must be at least %s, got %s", MinLeaseTTL, formatMs(p.LeaseTtlMs))
			}
			return atMostMax(p.LeaseTtlMs)
		}},
	{name: KeyRestartGrace, kind: kindDuration, ms: func(p *waldenv1.Policy) *int64 { return &p.RestartGraceMs },
		check: func(p *waldenv1.Policy) string { return nonNegative(p.RestartGraceMs) }},
	{name: KeyMaxConcurrentRecoveries, kind: kindUint, u32: func(p *waldenv1.Policy) *uint32 { return &p.MaxConcurrentRecoveries },
		check: func(p *waldenv1.Policy) string {
			if p.MaxConcurrentRecoveries < 1 {
				return "must be at least 1"
			}
			return ""
		}},
	{name: KeyMaxFailedFraction, kind: kindFloat, f64: func(p *waldenv1.Policy) *float64 { return &p.MaxFailedFraction },
		check: func(p *waldenv1.Policy) string {
			if !(p.MaxFailedFraction > 0 && p.MaxFailedFraction <= 1) {
				return fmt.Sprintf("must be greater than 0 and at most 1, got %v", p.MaxFailedFraction)
			}
			return ""
		}},
	{name: KeyCooldown, kind: kindDuration, ms: func(p *waldenv1.Policy) *int64 { return &p.CooldownMs },
		check: func(p *waldenv1.Policy) string { return nonNegative(p.CooldownMs) }},
	{name: KeyDryRun, kind: kindBool, b: func(p *waldenv1.Policy) *bool { return &p.DryRun }},
	{name: KeyDriftMargin, kind: kindDuration, ms: func(p *waldenv1.Policy) *int64 { return &p.DriftMarginMs },
		check: func(p *waldenv1.Policy) string { return nonNegative(p.DriftMarginMs) }},
}

// MaxDuration bounds every duration of the policy, so that no sum of them
// (failure_timeout + restart_grace, lease_ttl + drift_margin) can overflow
// a time.Duration: 30 days.
const MaxDuration = 30 * 24 * time.Hour

func positive(ms int64) string {
	if ms <= 0 {
		return fmt.Sprintf("must be positive, got %s", formatMs(ms))
	}
	return atMostMax(ms)
}

func nonNegative(ms int64) string {
	if ms < 0 {
		return fmt.Sprintf("must not be negative, got %s", formatMs(ms))
	}
	return atMostMax(ms)
}

func atMostMax(ms int64) string {
	if ms > MaxDuration.Milliseconds() {
		return fmt.Sprintf("must be at most %s, got %s", MaxDuration, formatMs(ms))
	}
	return ""
}

func lookup(name string) (key, bool) {
	for _, k := range keys {
		if k.name == name {
			return k, true
		}
	}
	return key{}, false
}

// Defaults returns the default policy: failure_timeout 5s, suspicion_quorum 0
// (a majority of the voters), lease_ttl 3s, restart_grace 0s,
// max_concurrent_recoveries 4, max_failed_fraction 0.5, cooldown 10m,
// dry_run false, drift_margin 500ms.
func Defaults() *waldenv1.Policy {
	return &waldenv1.Policy{
		FailureTimeoutMs:        5000,
		SuspicionQuorum:         0,
		LeaseTtlMs:              3000,
		RestartGraceMs:          0,
		MaxConcurrentRecoveries: 4,
		MaxFailedFraction:       0.5,
		CooldownMs:              10 * 60 * 1000,
		DryRun:                  false,
		DriftMarginMs:           500,
	}
}

// Keys returns the policy keys in their documented order.
func Keys() []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.name
	}
	return out
}

// Set parses value in the config file's syntax (durations "5s", "1m30s",
// "250ms"; unsigned integers; floats; booleans) into p's field for key and
// checks the range of that key alone. On error p is unchanged; the error
// names the key (ErrUnknownKey, or a *KeyError wrapping ErrInvalid).
func Set(p *waldenv1.Policy, name, value string) error {
	k, ok := lookup(name)
	if !ok {
		return fmt.Errorf("policy: %q (known keys: %s): %w", name, strings.Join(Keys(), ", "), ErrUnknownKey)
	}
	scratch := proto.Clone(p).(*waldenv1.Policy)
	value = strings.TrimSpace(value)
	switch k.kind {
	case kindDuration:
		d, err := time.ParseDuration(value)
		if err != nil {
			return &KeyError{Key: name, Reason: fmt.Sprintf("%q is not a duration (e.g. 5s, 250ms, 10m)", value)}
		}
		if d%time.Millisecond != 0 {
			return &KeyError{Key: name, Reason: fmt.Sprintf("%q is finer than a millisecond", value)}
		}
		*k.ms(scratch) = d.Milliseconds()
	case kindUint:
		n, err := strconv.ParseUint(value, 10, 32)
		if err != nil {
			return &KeyError{Key: name, Reason: fmt.Sprintf("%q is not a non-negative integer", value)}
		}
		*k.u32(scratch) = uint32(n)
	case kindFloat:
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return &KeyError{Key: name, Reason: fmt.Sprintf("%q is not a number", value)}
		}
		*k.f64(scratch) = f
	case kindBool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return &KeyError{Key: name, Reason: fmt.Sprintf("%q is not a boolean (true or false)", value)}
		}
		*k.b(scratch) = b
	}
	if k.check != nil {
		if reason := k.check(scratch); reason != "" {
			return &KeyError{Key: name, Reason: reason}
		}
	}
	proto.Reset(p)
	proto.Merge(p, scratch)
	return nil
}

// Format returns p's value for key in the config file's syntax ("" for an
// unknown key). Durations use the largest whole unit: "10m", "5s", "250ms".
func Format(p *waldenv1.Policy, name string) string {
	k, ok := lookup(name)
	if !ok {
		return ""
	}
	switch k.kind {
	case kindDuration:
		return formatMs(*k.ms(p))
	case kindUint:
		return strconv.FormatUint(uint64(*k.u32(p)), 10)
	case kindFloat:
		return strconv.FormatFloat(*k.f64(p), 'g', -1, 64)
	default:
		return strconv.FormatBool(*k.b(p))
	}
}

func formatMs(ms int64) string {
	switch {
	case ms == 0:
		return "0s"
	case ms%3_600_000 == 0:
		return fmt.Sprintf("%dh", ms/3_600_000)
	case ms%60_000 == 0:
		return fmt.Sprintf("%dm", ms/60_000)
	case ms%1000 == 0:
		return fmt.Sprintf("%ds", ms/1000)
	default:
		return fmt.Sprintf("%dms", ms)
	}
}

// Validate checks every key's range and the combinations that are unsafe:
// drift_margin must cover lease_ttl under the assumed bound on clock rates
// (lease.CheckDrift), and failure_timeout must exceed lease_ttl +
// drift_margin (a broker's grants expire before its silence is judged). The
// error is a *KeyError (wrapping ErrInvalid) naming the first offending key.
func Validate(p *waldenv1.Policy) error {
	if p == nil {
		return &KeyError{Key: KeyFailureTimeout, Reason: "no policy"}
	}
	for _, k := range keys {
		if k.check == nil {
			continue
		}
		if reason := k.check(p); reason != "" {
			return &KeyError{Key: k.name, Reason: reason}
		}
	}
	if err := lease.CheckDrift(time.Duration(p.LeaseTtlMs)*time.Millisecond, time.Duration(p.DriftMarginMs)*time.Millisecond); err != nil {
		return &KeyError{Key: KeyDriftMargin, Reason: err.Error()}
	}
	if p.FailureTimeoutMs <= p.LeaseTtlMs+p.DriftMarginMs {
		return &KeyError{Key: KeyFailureTimeout, Reason: fmt.Sprintf(
			"must be greater than lease_ttl + drift_margin (%s + %s), got %s: a broker could be declared failed while its lease may still be valid",
			formatMs(p.LeaseTtlMs), formatMs(p.DriftMarginMs), formatMs(p.FailureTimeoutMs))}
	}
	return nil
}

// Effective returns the effective policy and one entry per key (in Keys
// order) with its value and source: "default", "seed" when seed (the
// founding member's config file, nil before the cluster is seeded) differs
// from the default, "runtime" when overrides set the key (with its
// set_index). An override that does not parse is ignored (the state machine
// never stores one).
func Effective(seed *waldenv1.Policy, overrides *waldenv1.PolicyOverrides) (*waldenv1.Policy, []*waldenv1.PolicyEntry) {
	def := Defaults()
	eff := Defaults()
	if seed != nil {
		eff = proto.Clone(seed).(*waldenv1.Policy)
	}
	entries := make([]*waldenv1.PolicyEntry, 0, len(keys))
	for _, k := range keys {
		src := SourceDefault
		if Format(eff, k.name) != Format(def, k.name) {
			src = SourceSeed
		}
		var idx uint64
		if v, ok := overrides.GetValues()[k.name]; ok {
			if err := Set(eff, k.name, v); err == nil {
				src = SourceRuntime
				idx = overrides.GetSetIndex()[k.name]
			}
		}
		entries = append(entries, &waldenv1.PolicyEntry{Key: k.name, Value: Format(eff, k.name), Source: src, SetIndex: idx})
	}
	return eff, entries
}

// Drift returns the keys on which a member's config file (nil: none) differs
// from the cluster's seed, sorted in Keys order: the file is read only when
// the cluster is founded, so a difference is an operator's change that did
// not take effect.
func Drift(config, seed *waldenv1.Policy) []string {
	if config == nil || seed == nil {
		return nil
	}
	var out []string
	for _, k := range keys {
		if Format(config, k.name) != Format(seed, k.name) {
			out = append(out, k.name)
		}
	}
	return out
}

// Canonical parses value for key and returns it in Format's syntax, so that
// "5000ms" and "5s" are stored alike.
func Canonical(name, value string) (string, error) {
	p := Defaults()
	if err := Set(p, name, value); err != nil {
		return "", err
	}
	return Format(p, name), nil
}

// SortedKeys returns the keys of m sorted (for deterministic iteration).
func SortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// FromValues builds a policy from the defaults and key/value pairs in the
// config file's syntax (e.g. a decoded `policy:` section), applying keys in
// sorted order, then validates the result. The error names the first bad
// key.
func FromValues(values map[string]string) (*waldenv1.Policy, error) {
	p := Defaults()
	for _, k := range SortedKeys(values) {
		if err := Set(p, k, values[k]); err != nil {
			return nil, err
		}
	}
	if err := Validate(p); err != nil {
		return nil, err
	}
	return p, nil
}
