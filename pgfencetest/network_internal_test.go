package pgfencetest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// fakeEngine is a Docker engine with one container, attached to the
// networks in attached, whose disconnect from a network in failOn fails.
type fakeEngine struct {
	mu       sync.Mutex
	attached map[string]*network.EndpointSettings
	failOn   map[string]bool
}

func (e *fakeEngine) docker(f func(context.Context, networkAPI) error) error {
	return f(context.Background(), e)
}

func (e *fakeEngine) networks() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Sorted(maps.Keys(e.attached))
}

func (e *fakeEngine) ContainerInspect(context.Context, string, client.ContainerInspectOptions) (client.ContainerInspectResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var res client.ContainerInspectResult
	res.Container.NetworkSettings = &container.NetworkSettings{Networks: maps.Clone(e.attached)}
	return res, nil
}

func (e *fakeEngine) NetworkDisconnect(_ context.Context, name string, _ client.NetworkDisconnectOptions) (client.NetworkDisconnectResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failOn[name] {
		return client.NetworkDisconnectResult{}, errors.New("engine says no")
	}
	if _, ok := e.attached[name]; !ok {
		return client.NetworkDisconnectResult{}, errors.New("not connected to " + name)
	}
	delete(e.attached, name)
	return client.NetworkDisconnectResult{}, nil
}

func (e *fakeEngine) NetworkConnect(_ context.Context, name string, opts client.NetworkConnectOptions) (client.NetworkConnectResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.attached[name]; ok {
		return client.NetworkConnectResult{}, errors.New("already connected to " + name)
	}
	e.attached[name] = opts.EndpointConfig
	return client.NetworkConnectResult{}, nil
}

// TestCutContainerNetworkFailsPartWay: a container on two networks whose
// disconnect from one of them fails. CutContainerNetwork fails the test,
// and its cleanup reconnects the network it had cut, whichever of the two
// it tried first.
func TestCutContainerNetworkFailsPartWay(t *testing.T) {
	t.Parallel()
	for _, failing := range []string{"a", "b"} {
		e := &fakeEngine{
			attached: map[string]*network.EndpointSettings{"a": {Aliases: []string{"pg"}}, "b": {}},
			failOn:   map[string]bool{failing: true},
		}
		r := &recorder{TB: t}
		r.run(func(tb testing.TB) { cutNetwork(tb, "ctr", e.docker) })
		if !strings.Contains(r.fatal, "disconnect from "+failing) {
			t.Errorf("disconnect from %s fails: CutContainerNetwork says %q", failing, r.fatal)
		}
		if len(r.errors) > 0 {
			t.Errorf("disconnect from %s fails: the cleanup says %q", failing, r.errors)
		}
		if got := e.networks(); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("disconnect from %s fails: after the cleanup the container is on %q, want [a b]", failing, got)
		}
	}
}
