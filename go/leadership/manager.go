package leadership

import (
	"context"

	"github.com/fencedlease/fencedlease/go/fenced"
	"github.com/fencedlease/fencedlease/go/grant"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Manager is a manager.Manager whose controllers run only while the grant is held and whose
// client is fenced. Use it where the manager was used: the controllers' SetupWithManager
// adds them through it, and GetClient returns the fenced client.
type Manager struct {
	manager.Manager
	Gate   *Gate
	client client.Client
}

// Options of Wrap.
type Options struct {
	Gate   []Option
	Fenced []fenced.Option
}

// Wrap puts mgr's controllers (every runnable added through the result that needs leader
// election) under a Gate on src, adds the gate to mgr, makes GetClient the fenced client
// (stopping the gate on a denial that says another Pod leads), and, when src is a *grant.Dir,
// adds its watch to mgr. The three lines in a kubebuilder main.go are in docs/go.md.
func Wrap(mgr manager.Manager, src grant.Source, opts Options) (*Manager, error) {
	gate := NewGate(src, opts.Gate...)
	if dir, ok := src.(*grant.Dir); ok {
		if err := mgr.Add(watchRunnable{dir}); err != nil {
			return nil, err
		}
	}
	if err := mgr.Add(gate); err != nil {
		return nil, err
	}
	fopts := append([]fenced.Option{fenced.WithDenialHandler(gate.Deny)}, opts.Fenced...)
	return &Manager{Manager: mgr, Gate: gate, client: fenced.Wrap(mgr.GetClient(), src, fopts...)}, nil
}

// GetClient is the fenced client.
func (m *Manager) GetClient() client.Client { return m.client }

// Add gates r when it needs leader election (controllers do), else adds it to the manager
// (webhook servers, caches, runnables that say NeedLeaderElection false).
func (m *Manager) Add(r manager.Runnable) error {
	if le, ok := r.(manager.LeaderElectionRunnable); ok && !le.NeedLeaderElection() {
		return m.Manager.Add(r)
	}
	if _, ok := r.(interface{ GetCache() cache.Cache }); ok {
		return m.Manager.Add(r)
	}
	m.Gate.Add(r)
	return nil
}

// watchRunnable runs a grant.Dir's watch for the manager's lifetime, leader or not.
type watchRunnable struct{ dir *grant.Dir }

func (w watchRunnable) Start(ctx context.Context) error { return w.dir.Run(ctx) }
func (w watchRunnable) NeedLeaderElection() bool        { return false }
