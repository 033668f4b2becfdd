// Package deploy checks the kustomize bases and overlays beside it: each
// builds with kustomize's own library (krusty), every object decodes
// strictly into the Kubernetes API types (an unknown or misspelt field
// fails), and every kpar container's arguments and KPAR_* variables pass
// `kpar forward --check-config`, whose output then confirms the probes and
// the ports. It is a module of its own so that the Kubernetes libraries
// stay out of kpar's.
package deploy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// layouts are the directories a user applies with kubectl apply -k.
var layouts = []string{"standalone", "sidecar", "keda", "keda-kafka"}

// kparBin is the kpar command, built once by TestMain.
var kparBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kpar-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kparBin = filepath.Join(dir, "kpar")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	build := exec.CommandContext(ctx, "go", "build", "-o", kparBin, ".")
	build.Dir = "../cmd/kpar" // go.work joins the modules
	out, err := build.CombinedOutput()
	cancel()
	code := 1
	if err != nil {
		fmt.Fprintf(os.Stderr, "building kpar: %v\n%s", err, out)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// object is one built and decoded Kubernetes object.
type object struct {
	kind, name string
	obj        any // *appsv1.Deployment, *corev1.Service, *scaledObject
}

// kinds are the kinds the layouts may hold, each with the type it must
// decode into.
var kinds = map[string]func() any{
	"Deployment":   func() any { return new(appsv1.Deployment) },
	"Service":      func() any { return new(corev1.Service) },
	"ScaledObject": func() any { return new(scaledObject) },
}

// build runs kustomize on dir and decodes every object strictly.
func build(fsys filesys.FileSystem, dir string) ([]object, error) {
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []object
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		newObj, ok := kinds[r.GetKind()]
		if !ok {
			return nil, fmt.Errorf("%s: %s %s: a kind this test does not know; add its type to kinds", dir, r.GetKind(), r.GetName())
		}
		obj := newObj()
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", dir, r.GetKind(), r.GetName(), err)
		}
		objs = append(objs, object{r.GetKind(), r.GetName(), obj})
	}
	return objs, nil
}

func mustBuild(t *testing.T, dir string) []object {
	t.Helper()
	objs, err := build(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestEveryLayoutBuildsIntoValidObjects(t *testing.T) {
	for _, dir := range layouts {
		t.Run(dir, func(t *testing.T) {
			objs := mustBuild(t, dir)
			var deployments int
			for _, o := range objs {
				if o.kind == "Deployment" {
					deployments++
				}
			}
			if deployments != 1 {
				t.Errorf("%d Deployments, want 1", deployments)
			}
		})
	}
}

// The bases apply on a cluster without KEDA: only built-in kinds.
func TestBasesNeedNoKEDA(t *testing.T) {
	for _, dir := range []string{"standalone", "sidecar"} {
		for _, o := range mustBuild(t, dir) {
			if o.kind == "ScaledObject" {
				t.Errorf("%s holds the ScaledObject %s: a cluster without KEDA refuses it; put it in an overlay", dir, o.name)
			}
		}
	}
}

func TestKparContainersPassCheckConfig(t *testing.T) {
	for _, dir := range layouts {
		t.Run(dir, func(t *testing.T) {
			for _, err := range checkLayout(t.Context(), mustBuild(t, dir)) {
				t.Error(err)
			}
		})
	}
}

// In the sidecar layout, kpar posts to the service in its own pod, and
// the pod's shutdown gives kpar's drain a service that still answers.
func TestSidecarPostsToItsOwnPod(t *testing.T) {
	var d *appsv1.Deployment
	for _, o := range mustBuild(t, "sidecar") {
		if o.kind == "Deployment" {
			d = o.obj.(*appsv1.Deployment)
		}
	}
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 2 {
		t.Fatalf("%d containers, want the service and kpar", len(spec.Containers))
	}
	kparC, app := spec.Containers[1], spec.Containers[0]
	if kparC.Name != "kpar" {
		t.Fatalf("second container is %q, want kpar", kparC.Name)
	}
	u := envValue(kparC, "KPAR_URL")
	host, port, ok := strings.Cut(strings.TrimPrefix(u, "http://"), ":")
	port, _, _ = strings.Cut(port, "/")
	if !ok || host != "127.0.0.1" {
		t.Errorf("KPAR_URL %s: want http://127.0.0.1:PORT/..., the service in the same pod", u)
	}
	if !slices.ContainsFunc(app.Ports, func(p corev1.ContainerPort) bool { return strconv.Itoa(int(p.ContainerPort)) == port }) {
		t.Errorf("KPAR_URL %s: no port %s on the %s container", u, port, app.Name)
	}
	if kparC.ReadinessProbe != nil {
		t.Error("the kpar sidecar has a readinessProbe: a rebalance would take the service out of its Service")
	}
	if kparC.LivenessProbe == nil {
		t.Error("the kpar sidecar has no livenessProbe")
	}
	if kparC.Resources.Requests.Memory().IsZero() || kparC.Resources.Limits.Memory().IsZero() {
		t.Error("the kpar sidecar has no memory request or limit")
	}
	report, err := checkConfig(t.Context(), kparC)
	if err != nil {
		t.Fatal(err)
	}
	shutdown, err := time.ParseDuration(report["shutdown_timeout"])
	if err != nil {
		t.Fatalf("shutdown_timeout: %v", err)
	}
	if app.Lifecycle == nil || app.Lifecycle.PreStop == nil || app.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("the %s container has no preStop sleep: it would stop before kpar's in-flight requests finish", app.Name)
	}
	wait := time.Duration(app.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	if !(shutdown < wait && wait < grace) {
		t.Errorf("kpar's shutdown timeout %v, the service's preStop %v and the grace period %v: want them in that order", shutdown, wait, grace)
	}
}

// The ScaledObjects scale the forwarder's Deployment, and the Kafka
// scaler reads the lag of the group and topic kpar consumes.
func TestScaledObjectsTargetTheForwarder(t *testing.T) {
	for _, dir := range []string{"keda", "keda-kafka"} {
		t.Run(dir, func(t *testing.T) {
			var so *scaledObject
			deployments := map[string]*appsv1.Deployment{}
			for _, o := range mustBuild(t, dir) {
				switch v := o.obj.(type) {
				case *scaledObject:
					so = v
				case *appsv1.Deployment:
					deployments[o.name] = v
				}
			}
			if so == nil {
				t.Fatal("no ScaledObject")
			}
			d, ok := deployments[so.Spec.ScaleTargetRef.Name]
			if !ok {
				t.Fatalf("scaleTargetRef %q names no Deployment of the build", so.Spec.ScaleTargetRef.Name)
			}
			if so.Spec.MaxReplicaCount == nil || so.Spec.MinReplicaCount == nil || *so.Spec.MaxReplicaCount < *so.Spec.MinReplicaCount {
				t.Errorf("replica counts min %v max %v", so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount)
			}
			c := kparContainer(d)
			for _, tr := range so.Spec.Triggers {
				if tr.Type != "kafka" {
					continue
				}
				if g, want := tr.Metadata["consumerGroup"], envValue(*c, "KPAR_GROUP"); g != want {
					t.Errorf("kafka trigger consumerGroup %q, KPAR_GROUP %q", g, want)
				}
				if topic, want := tr.Metadata["topic"], envValue(*c, "KPAR_TOPIC"); topic != want {
					t.Errorf("kafka trigger topic %q, KPAR_TOPIC %q", topic, want)
				}
			}
		})
	}
}

// The checks above would catch the mistakes they are for: a misspelt
// field, a misspelt variable, a probe on a path kpar does not serve, and
// a status server the kubelet cannot reach.
func TestTheChecksCatchMistakes(t *testing.T) {
	orig, err := os.ReadFile("standalone/kpar-forward.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, from, to, says string
	}{
		{"misspelt field", "livenessProbe:", "livenesProbe:", `unknown field "livenesProbe"`},
		{"misspelt variable", "name: KPAR_CONCURRENCY", "name: KPAR_CONCURENCY", "unknown KPAR_CONCURENCY"},
		{"bad value", `value: "64"`, `value: "many"`, "KPAR_CONCURRENCY"},
		{"probe path", "path: /readyz", "path: /ready", `probe path /ready`},
		{"status on loopback", "value: 0.0.0.0:9464", "value: 127.0.0.1:9464", "the kubelet"},
		{"probe port", "containerPort: 9464", "containerPort: 9465", "port 9465"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(orig, []byte(tc.from)) {
				t.Fatalf("standalone/kpar-forward.yaml no longer holds %q", tc.from)
			}
			fsys := filesys.MakeFsInMemory()
			if err := fsys.WriteFile("/k/kpar-forward.yaml", bytes.Replace(orig, []byte(tc.from), []byte(tc.to), 1)); err != nil {
				t.Fatal(err)
			}
			if err := fsys.WriteFile("/k/kustomization.yaml", []byte("resources:\n  - kpar-forward.yaml\n")); err != nil {
				t.Fatal(err)
			}
			objs, err := build(fsys, "/k")
			errs := []error{err}
			if err == nil {
				errs = checkLayout(t.Context(), objs)
			}
			var all []string
			for _, e := range errs {
				if e != nil {
					all = append(all, e.Error())
				}
			}
			if got := strings.Join(all, "\n"); !strings.Contains(got, tc.says) {
				t.Errorf("errors %q, want one saying %s", got, tc.says)
			}
		})
	}
}

// checkLayout checks every kpar container of the objects with kpar
// forward --check-config (run with the container's arguments and
// variables, and nothing else), then its probes, ports and grace period
// against what the dry run says the status server does.
func checkLayout(ctx context.Context, objs []object) []error {
	var errs []error
	for _, o := range objs {
		d, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		c := kparContainer(d)
		if c == nil {
			errs = append(errs, fmt.Errorf("Deployment %s: no kpar container", o.name))
			continue
		}
		where := fmt.Sprintf("Deployment %s container %s", o.name, c.Name)
		if len(c.Args) == 0 || c.Args[0] != "forward" {
			errs = append(errs, fmt.Errorf("%s: args %q, want forward first", where, c.Args))
			continue
		}
		report, err := checkConfig(ctx, *c)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		listen := report["metrics_listen"]
		host, port, err := net.SplitHostPort(listen)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: no status server (KPAR_METRICS_LISTEN): the probes have nothing to ask", where))
			continue
		case host == "127.0.0.1" || host == "localhost":
			errs = append(errs, fmt.Errorf("%s: the status server listens on %s, which the kubelet cannot reach: use 0.0.0.0:%s", where, listen, port))
		}
		paths := strings.Split(report["status_paths"], ",")
		for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if p == nil {
				continue
			}
			if p.HTTPGet == nil {
				errs = append(errs, fmt.Errorf("%s: %s probe is not an httpGet", where, name))
				continue
			}
			if !slices.Contains(paths, p.HTTPGet.Path) {
				errs = append(errs, fmt.Errorf("%s: %s probe path %s: kpar serves %s", where, name, p.HTTPGet.Path, report["status_paths"]))
			}
			if got := probePort(*c, p.HTTPGet.Port.String()); got != port {
				errs = append(errs, fmt.Errorf("%s: %s probe on port %s, the status server listens on %s", where, name, got, port))
			}
		}
		if scrape := d.Spec.Template.Annotations["prometheus.io/port"]; scrape != "" && scrape != port {
			errs = append(errs, fmt.Errorf("%s: prometheus.io/port %s, the status server listens on %s", where, scrape, port))
		}
		shutdown, err := time.ParseDuration(report["shutdown_timeout"])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: kpar forward --check-config printed no shutdown_timeout: %v", where, err))
		}
		if grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds; err == nil && (grace == nil || time.Duration(*grace)*time.Second <= shutdown) {
			errs = append(errs, fmt.Errorf("%s: terminationGracePeriodSeconds must exceed the shutdown timeout %v, or SIGKILL cuts the drain", where, shutdown))
		}
	}
	return errs
}

// checkConfig runs kpar with the container's arguments plus
// --check-config, in an environment of the container's variables only
// (those from a Secret or the downward API get a stand-in value), and
// returns the "key: value" lines it prints.
func checkConfig(ctx context.Context, c corev1.Container) (map[string]string, error) {
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			v = "from-the-cluster"
		}
		env = append(env, e.Name+"="+v)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kparBin, append(slices.Clone(c.Args), "--check-config")...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kpar %s --check-config: %v: %s", strings.Join(c.Args, " "), err, strings.TrimSpace(stderr.String()))
	}
	report := map[string]string{}
	for line := range strings.Lines(stdout.String()) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ": "); ok && strings.HasPrefix(line, "  ") {
			report[k] = v
		}
	}
	return report, nil
}

// kparContainer is the Deployment's container running the kpar image.
func kparContainer(d *appsv1.Deployment) *corev1.Container {
	for i, c := range d.Spec.Template.Spec.Containers {
		if c.Image == "kpar" || strings.HasPrefix(c.Image, "kpar:") || strings.Contains(c.Image, "/kpar:") {
			return &d.Spec.Template.Spec.Containers[i]
		}
	}
	return nil
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// probePort resolves a probe's port, a number or the name of one of the
// container's ports, to a number.
func probePort(c corev1.Container, port string) string {
	for _, p := range c.Ports {
		if p.Name == port {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return port
}

// scaledObject is the part of KEDA's ScaledObject (keda.sh/v1alpha1) that
// the layouts use, with the same JSON names, so that strict decoding
// catches a misspelt field there too. (KEDA's own Go module would bring
// its whole controller in.)
type scaledObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		PollingInterval  *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod   *int32 `json:"cooldownPeriod,omitempty"`
		IdleReplicaCount *int32 `json:"idleReplicaCount,omitempty"`
		MinReplicaCount  *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount  *int32 `json:"maxReplicaCount,omitempty"`
		Triggers         []struct {
			Type              string            `json:"type"`
			Name              string            `json:"name,omitempty"`
			MetricType        string            `json:"metricType,omitempty"`
			Metadata          map[string]string `json:"metadata"`
			AuthenticationRef *struct {
				Name string `json:"name"`
				Kind string `json:"kind,omitempty"`
			} `json:"authenticationRef,omitempty"`
		} `json:"triggers"`
	} `json:"spec"`
}
