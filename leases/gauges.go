package leases

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Gauges: how many leases this Client holds and how many elections it
// leads, read from its own state when the metrics are collected (so they
// cost nothing between collections). Observable up-down counters, as
// OpenTelemetry recommends for counts of things in use.
const (
	metricHeld   = "pgfence.lease.held"   // {lease}
	metricLeader = "pgfence.lease.leader" // {election}; per name with WithNameAttribute: 1 while leading
)

// registerGauges creates the gauges on mp and registers their callback;
// the returned function unregisters it (Close). A provider that refuses
// them is logged: metrics never stop leases.
func (c *Client) registerGauges(mp metric.MeterProvider) func() {
	meter := mp.Meter(meterName)
	held, err1 := meter.Int64ObservableUpDownCounter(metricHeld, metric.WithUnit("{lease}"),
		metric.WithDescription("Leases this client holds now."))
	leader, err2 := meter.Int64ObservableUpDownCounter(metricLeader, metric.WithUnit("{election}"),
		metric.WithDescription("Elections (Lead) this client leads now; with the name attribute, 1 per election led."))
	if err1 != nil || err2 != nil {
		c.log.Warn("leases: gauges unavailable", "err", errors.Join(err1, err2))
		return func() {}
	}
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.mu.Lock()
		n := int64(len(c.held))
		var leading int64
		var names []string
		for name, k := range c.leading {
			leading += int64(k)
			if c.cfg.nameAttr {
				names = append(names, name)
			}
		}
		c.mu.Unlock()
		o.ObserveInt64(held, n)
		if !c.cfg.nameAttr {
			o.ObserveInt64(leader, leading)
			return nil
		}
		for _, name := range names {
			o.ObserveInt64(leader, 1, metric.WithAttributes(attribute.String(attrName, name)))
		}
		return nil
	}, held, leader)
	if err != nil {
		c.log.Warn("leases: gauges unavailable", "err", err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// setLeading records that a Lead call of this client became (+1) or
// stopped being (-1) leader of name.
func (c *Client) setLeading(name string, delta int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leading[name] += delta; c.leading[name] <= 0 {
		delete(c.leading, name)
	}
}
