// Package promreg registers Prometheus collectors so that several pgwake
// components in one process can share a registry: a collector that is
// already registered (by an earlier Client, Listener or subscription) is
// reused, and its series keep counting for every user.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Register registers c with reg, or, when reg already holds an equal
// collector of the same type, returns that one instead.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		if existing, ok := dup.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// RegisterAll is Register for several collectors of one type, each replaced
// in place by the collector reg keeps.
func RegisterAll[C prometheus.Collector](reg prometheus.Registerer, cs ...*C) error {
	for _, c := range cs {
		got, err := Register(reg, *c)
		if err != nil {
			return err
		}
		*c = got
	}
	return nil
}

// Sum adds up the samples of the metric family name whose labels include
// every name/value pair in labels: counter and gauge values, and the sample
// counts of histograms. A family that is absent sums to 0.
func Sum(g prometheus.Gatherer, name string, labels ...string) (float64, error) {
	var sum float64
	err := each(g, name, labels, func(_ map[string]string, v float64) { sum += v })
	return sum, err
}

// SampleSum adds up the sample sums of the histogram family name whose
// labels include every name/value pair in labels (0 if absent).
func SampleSum(g prometheus.Gatherer, name string, labels ...string) (float64, error) {
	var sum float64
	err := eachMetric(g, name, labels, func(_ map[string]string, m *dto.Metric) { sum += m.GetHistogram().GetSampleSum() })
	return sum, err
}

// SumBy is Sum grouped by the value of one label.
func SumBy(g prometheus.Gatherer, name, label string) (map[string]float64, error) {
	out := map[string]float64{}
	err := each(g, name, nil, func(have map[string]string, v float64) {
		if lv, ok := have[label]; ok {
			out[lv] += v
		}
	})
	return out, err
}

func each(g prometheus.Gatherer, name string, labels []string, f func(map[string]string, float64)) error {
	return eachMetric(g, name, labels, func(have map[string]string, m *dto.Metric) {
		f(have, m.GetCounter().GetValue()+m.GetGauge().GetValue()+float64(m.GetHistogram().GetSampleCount()))
	})
}

func eachMetric(g prometheus.Gatherer, name string, labels []string, f func(map[string]string, *dto.Metric)) error {
	mfs, err := g.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := make(map[string]string, len(m.GetLabel()))
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metrics
				}
			}
			f(have, m)
		}
	}
	return nil
}
