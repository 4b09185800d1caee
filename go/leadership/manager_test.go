package leadership

import (
	"context"
	"testing"

	"github.com/fencedlease/fencedlease/go/fenced"
	"github.com/fencedlease/fencedlease/go/grant"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A real manager (nothing listens at its address: nothing here contacts it): a controller
// made with it goes under the gate, GetClient is fenced.
func TestWrapAManager(t *testing.T) {
	mgr, err := manager.New(&rest.Config{Host: "http://127.0.0.1:9"}, manager.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src := grant.NewDir(t.TempDir())
	m, err := Wrap(mgr, src, Options{Gate: []Option{WithName("wrap")}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ctrlcontroller.New("c", m, ctrlcontroller.Options{
		Reconciler: reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil }),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Gate.held) != 1 {
		t.Fatalf("the controller is not gated: %v", m.Gate.held)
	}
	if m.GetClient() == mgr.GetClient() {
		t.Fatal("GetClient is not the fenced client")
	}
	// No grant in the directory: the fenced client sends nothing.
	labelled := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns", Labels: map[string]string{fenced.LeaseLabel: "l"}}}
	err = m.GetClient().Create(context.Background(), labelled)
	if !grant.IsAbsent(err) {
		t.Fatalf("%v", err)
	}
}
