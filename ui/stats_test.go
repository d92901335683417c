package ui_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// This file holds BenchmarkDashboardLatencyImpact's estimator: the p99 of
// a configuration's jobs pooled over its blocks, and a bootstrap interval
// for the ratio of two configurations' pooled p99s that resamples rounds
// (a round runs one block of every configuration, back to back, so the
// blocks of a round share the machine's mood of the moment and are resampled
// together).

// p99Rank is the rank, from the largest (1 = the largest), of p99's value
// among n values: p99 returns the value at ascending index ceil(0.99n)-1.
func p99Rank(n int) int { return n - int(math.Ceil(0.99*float64(n))) + 1 }

// tails holds a configuration's blocks, each cut to its largest values in
// descending order: enough to find the pooled p99 of any resample of rounds
// when every block has the same number of values.
type tails struct {
	perBlock int         // values in each (uncut) block
	top      [][]float64 // per round, descending, at most p99Rank(rounds*perBlock)
}

// newTails cuts blocks (one per round, each of perBlock values).
func newTails(blocks [][]float64, perBlock int) tails {
	k := p99Rank(len(blocks) * perBlock)
	t := tails{perBlock: perBlock}
	for _, b := range blocks {
		if len(b) != perBlock {
			panic("newTails: blocks of unequal size")
		}
		d := slices.Clone(b)
		slices.Sort(d)
		slices.Reverse(d)
		t.top = append(t.top, d[:min(k, len(d))])
	}
	return t
}

// p99 is the p99 of the values of the rounds in idx (repeats count twice)
// pooled: the k-th largest, merged from the blocks' tails.
func (t tails) p99(idx []int) float64 {
	k := p99Rank(len(idx) * t.perBlock)
	pos := make([]int, len(idx))
	v := math.NaN()
	for range k {
		best := -1
		for j, r := range idx {
			if pos[j] < len(t.top[r]) && (best < 0 || t.top[r][pos[j]] > t.top[idx[best]][pos[best]]) {
				best = j
			}
		}
		v = t.top[idx[best]][pos[best]]
		pos[best]++
	}
	return v
}

// ratioCI is the ratio of b's pooled p99 to a's over all rounds, and the
// 5th and 95th percentiles of that ratio over resamples bootstrap
// resamples of the rounds (drawn with replacement, the same rounds for a
// and b), with a fixed seed: a 90% percentile interval.
func ratioCI(a, b tails, resamples int, seed uint64) (ratio, lo, hi float64) {
	rounds := len(a.top)
	all := make([]int, rounds)
	for i := range all {
		all[i] = i
	}
	ratio = b.p99(all) / a.p99(all)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	rs := make([]float64, resamples)
	idx := make([]int, rounds)
	for i := range rs {
		for j := range idx {
			idx[j] = rng.IntN(rounds)
		}
		rs[i] = b.p99(idx) / a.p99(idx)
	}
	slices.Sort(rs)
	at := func(q float64) float64 { return rs[min(len(rs)-1, int(q*float64(len(rs))))] }
	return ratio, at(0.05), at(0.95)
}

// verdict says what an interval shows about a target ratio.
func verdict(lo, hi, target float64) string {
	switch {
	case hi <= target:
		return "within the target (the interval's upper end is at or under it)"
	case lo > target:
		return "over the target (the interval's lower end is above it)"
	default:
		return "undecided (the interval straddles the target)"
	}
}

// The merged tails give the p99 of the pooled values, and the interval
// covers the true ratio: about 1 for two samples of one distribution, about
// 1.5 when one is scaled by 1.5 (and then excludes 1.1).
func TestRatioCI(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rounds, per = 12, 1000
	draw := func(scale float64) [][]float64 {
		var bs [][]float64
		for range rounds {
			b := make([]float64, per)
			for i := range b {
				b[i] = scale * rng.ExpFloat64()
			}
			bs = append(bs, b)
		}
		return bs
	}
	a, same, slow := draw(1), draw(1), draw(1.5)
	ta := newTails(a, per)
	require.Equal(t, p99(slices.Concat(a...)), ta.p99([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}))
	require.Equal(t, p99(slices.Concat(a[3], a[3], a[7])), ta.p99([]int{3, 3, 7}))

	r, lo, hi := ratioCI(ta, newTails(same, per), 2000, 1)
	t.Logf("same: %.3f [%.3f, %.3f]", r, lo, hi)
	require.True(t, lo <= 1 && 1 <= hi, "the interval covers 1")
	require.Less(t, lo, r)
	require.Greater(t, hi, r)

	r, lo, hi = ratioCI(ta, newTails(slow, per), 2000, 1)
	t.Logf("1.5x: %.3f [%.3f, %.3f]", r, lo, hi)
	require.True(t, lo <= 1.5 && 1.5 <= hi, "the interval covers 1.5")
	require.Equal(t, "over the target (the interval's lower end is above it)", verdict(lo, hi, 1.1))
}
