package lease

import (
	"fmt"
	"math"
	"time"
)

// MaxRateError is the assumed bound ρ on how far any machine's boot clock
// may run from real time: every clock's rate lies in [1-ρ, 1+ρ]. 1000 ppm is
// ten times the tolerance of common quartz oscillators and twice the largest
// slew NTP applies; docs/safety.md explains the choice.
const MaxRateError = 0.001

// RequiredDrift returns the smallest drift allowance d for which a grant of
// ttl is safe under MaxRateError, with an agent safety margin of zero: the
// agent stops counting the grant (ttl after it sent the renewal, on a clock
// as slow as 1-ρ) no later in real time than the coordinator may attest it
// expired (ttl + d after it granted, on a clock as fast as 1+ρ):
//
//	ttl/(1-ρ) ≤ (ttl+d)/(1+ρ)  ⇔  d ≥ 2ρ·ttl/(1-ρ)
//
// rounded up to the millisecond.
func RequiredDrift(ttl time.Duration) time.Duration {
	d := 2 * MaxRateError * float64(ttl) / (1 - MaxRateError)
	return time.Duration(math.Ceil(d/float64(time.Millisecond))) * time.Millisecond
}

// CheckDrift reports an error when drift does not cover ttl (see
// RequiredDrift).
func CheckDrift(ttl, drift time.Duration) error {
	if need := RequiredDrift(ttl); drift < need {
		return fmt.Errorf("must be at least %s for a lease_ttl of %s (clock rates may differ by up to %.1f%%), got %s",
			need, ttl, 2*MaxRateError*100, drift)
	}
	return nil
}
