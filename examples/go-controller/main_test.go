package main

import (
	"context"
	"testing"
	"time"

	"github.com/fencedlease/fencedlease/go/fenced"
	"github.com/fencedlease/fencedlease/go/grant"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func held(token int64) grant.Source {
	return grant.Func(func() (grant.Grant, error) {
		return grant.Grant{Token: token, LeaseID: "5f3a9c0d12ab", ValidUntil: time.Now().Add(time.Hour), State: "held"}, nil
	})
}

func beacon(labels map[string]string) *unstructured.Unstructured {
	b := &unstructured.Unstructured{}
	b.SetGroupVersionKind(BeaconGVK)
	b.SetNamespace("ns")
	b.SetName("demo")
	b.SetUID(types.UID("uid-demo"))
	b.SetLabels(labels)
	return b
}

func oldChild(labels map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "demo-pod-a-0ld-1", Namespace: "ns", Labels: labels}}
}

// One round through the fenced client: the Beacon's spec labelled and stamped, its status
// written, a child created stamped, the replica's earlier child deleted; in the control
// (example.com/fenced=false) the same writes, nothing labelled or stamped.
func TestARound(t *testing.T) {
	for _, fencedBeacon := range []bool{true, false} {
		var labels map[string]string
		childLabels := map[string]string{BeaconLabel: "demo", WriterLabel: "pod-a"}
		if !fencedBeacon {
			labels = map[string]string{FencedLabel: "false"}
		} else {
			childLabels[fenced.LeaseLabel] = "go-controller"
		}
		scheme := runtime.NewScheme()
		if err := clientgoscheme.AddToScheme(scheme); err != nil {
			t.Fatal(err)
		}
		b := beacon(labels)
		base := fake.NewClientBuilder().WithScheme(scheme).
			WithObjects(b, oldChild(childLabels)).WithStatusSubresource(b).Build()
		r := &Reconciler{Client: fenced.Wrap(base, held(7)), Pod: "pod-a", Lease: "go-controller", Boot: "b00t"}
		req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "demo"}}
		if _, err := r.Reconcile(context.Background(), req); err != nil {
			t.Fatalf("fenced=%v: %v", fencedBeacon, err)
		}

		got := beacon(nil)
		if err := base.Get(context.Background(), req.NamespacedName, got); err != nil {
			t.Fatal(err)
		}
		leader, _, _ := unstructured.NestedString(got.Object, "spec", "leader")
		status, _, _ := unstructured.NestedString(got.Object, "status", "leader")
		if leader != "pod-a" || status != "pod-a" {
			t.Fatalf("fenced=%v: spec.leader %q, status.leader %q", fencedBeacon, leader, status)
		}
		wantToken := map[bool]string{true: "7", false: ""}[fencedBeacon]
		if got.GetAnnotations()[fenced.TokenAnnotation] != wantToken || (got.GetLabels()[fenced.LeaseLabel] != "") != fencedBeacon {
			t.Fatalf("fenced=%v: labels %v, annotations %v", fencedBeacon, got.GetLabels(), got.GetAnnotations())
		}
		var child corev1.ConfigMap
		if err := base.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "demo-pod-a-b00t-1"}, &child); err != nil {
			t.Fatalf("fenced=%v: the round's child: %v", fencedBeacon, err)
		}
		if child.Annotations[fenced.TokenAnnotation] != wantToken || len(child.OwnerReferences) != 1 {
			t.Fatalf("fenced=%v: child %v", fencedBeacon, child.ObjectMeta)
		}
		err := base.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "demo-pod-a-0ld-1"}, &child)
		if !apierrors.IsNotFound(err) {
			t.Fatalf("fenced=%v: the earlier child is still there: %v", fencedBeacon, err)
		}
	}
}
