// Reads a JSON array of Kubernetes objects on stdin and validates every PodMonitor,
// PrometheusRule and AlertmanagerConfig (v1alpha1, deploy/kubernetes/examples) against the Prometheus Operator CRD schemas (compiled validators of
// @kubernetes-models/prometheus-operator). Prints one line per object; exits 1 on any
// invalid object, 0 otherwise.
import { PodMonitor, PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { AlertmanagerConfig } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1alpha1";

const kinds = { PodMonitor, PrometheusRule, AlertmanagerConfig };
let input = "";
for await (const chunk of process.stdin) input += chunk;
let failed = 0;
for (const obj of JSON.parse(input)) {
  const Model = kinds[obj.kind];
  if (!Model) continue;
  try {
    new Model(obj).validate();
    console.log(`ok ${obj.kind}/${obj.metadata.name}`);
  } catch (err) {
    failed++;
    console.log(`invalid ${obj.kind}/${obj.metadata.name}: ${err.message}`);
  }
}
process.exit(failed ? 1 : 0);
