// Package promreg registers Prometheus collectors so that several pgwake
// components in one process can share a registry: a collector that is
// already registered (by an earlier Client, Listener or subscription) is
// reused, and its series keep counting for every user.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
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
