{{/* Chart name, truncated to the 63 characters Kubernetes names allow. */}}
{{- define "htmllm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, plus the chart name unless the release already contains it. */}}
{{- define "htmllm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "htmllm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "htmllm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "htmllm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "htmllm.labels" -}}
helm.sh/chart: {{ include "htmllm.chart" . }}
{{ include "htmllm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: embedding-server
{{- end }}

{{- define "htmllm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "htmllm.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The CPU image, or the CUDA image (tag + gpu.imageTagSuffix) when gpu.enabled. */}}
{{- define "htmllm.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.gpu.enabled }}
{{- $tag = printf "%s%s" $tag .Values.gpu.imageTagSuffix }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* Where the server finds its checkpoint; empty for the image's bundled default model. */}}
{{- define "htmllm.modelPath" -}}
{{- if ne .Values.model.source "bundled" }}
{{- if .Values.model.subPath }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.subPath) }}
{{- else }}
{{- .Values.model.mountPath }}
{{- end }}
{{- end }}
{{- end }}

{{/* The claim the model volume mounts when model.source is "pvc". */}}
{{- define "htmllm.modelClaimName" -}}
{{- default (printf "%s-model" (include "htmllm.fullname" .)) .Values.model.pvc.existingClaim }}
{{- end }}

{{/* The Secret holding the API key. */}}
{{/* Where the API key Secret is mounted, and the key file in it (HTMLLM_API_KEY_FILE). */}}
{{- define "htmllm.apiKeyDir" -}}
/etc/htmllm/api-keys
{{- end }}

{{- define "htmllm.apiKeyFile" -}}
{{ include "htmllm.apiKeyDir" . }}/keys
{{- end }}

{{- define "htmllm.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "htmllm.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/*
The pod's grace period: the preStop sleep and the server's drain must both fit inside it, or the kubelet
kills the server (SIGKILL) with accepted requests still queued. The default adds 15 s for what follows the
drain budget: uvicorn's wait rounded up to whole seconds, the engine's last stop, and the exit (the
server's exit handlers, its worker processes stopped), about a second or two in all. It need not cover a
forward pass: a pass still running when the budget ends has had its documents answered 503, and the
server exits without waiting for it (service.api.main.end_process). An explicit one must leave at least
2 s past the drain (a 3 s drain's stop measured 3.07 s from the signal): one that did not had the server
SIGKILLed at the end of its stop.
*/}}
{{- define "htmllm.terminationGracePeriodSeconds" -}}
{{- /* The drain time may have a fraction (7.5), or be a decimal string (`--set` passes 7.5 as one). */}}
{{- $needed := addf (int .Values.lifecycle.preStopSleepSeconds) (float64 .Values.server.drainTimeoutSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add (int (ceil $needed)) 15 }}
{{- else if lt (float64 .Values.terminationGracePeriodSeconds) (addf $needed 2) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be at least lifecycle.preStopSleepSeconds + server.drainTimeoutSeconds + 2 (%v): the server's stop takes up to a second past its drain budget, then it exits" .Values.terminationGracePeriodSeconds (addf $needed 2)) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
"true" when the server's CPU threads per forward pass come from the container's CPU request. The server
reads a CPU limit from its cgroup itself; with a request and no limit the cgroup says nothing, and
torch and onnxruntime would run one thread per node core against a share of a few. Anything the values
already say about threads (server.intraOpThreads, HTMLLM_INTRA_OP_THREADS or OMP_NUM_THREADS) wins.
*/}}
{{- define "htmllm.threadsFromRequest" -}}
{{- $named := false }}
{{- range .Values.extraEnv | default list }}
{{- if has .name (list "OMP_NUM_THREADS" "HTMLLM_INTRA_OP_THREADS") }}{{ $named = true }}{{ end }}
{{- end }}
{{- $resources := .Values.resources | default dict }}
{{- $limits := $resources.limits | default dict }}
{{- $requests := $resources.requests | default dict }}
{{- $extraSettings := .Values.extraSettings | default dict }}
{{- if and (not .Values.server.intraOpThreads) (not (hasKey $extraSettings "HTMLLM_INTRA_OP_THREADS")) (not $named) (not $limits.cpu) $requests.cpu }}true{{ end }}
{{- end }}

{{/*
A setting's value as its environment variable's text. Helm reads every number in values as a float64,
which `toString` writes in exponent form from a million up ("1e+06"): the service's integer settings
refuse that, so the pod would not start. toJson writes whole numbers as digits and fractions as
they are.
*/}}
{{- define "htmllm.settingValue" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/*
The HTMLLM_* settings the chart itself sets (the ConfigMap's data before extraSettings), as JSON. The
port is the container port the probes and the Service use; the host is an address the kubelet's probes
reach the pod on (server.host: the schema admits only the all-addresses ones); the drain time is the one
the grace period is derived from. extraSettings and extraEnv may not set these again (htmllm.validate).
*/}}
{{- define "htmllm.settings" -}}
{{- $s := .Values.server }}
{{- $settings := dict
  "HTMLLM_HOST" $s.host
  "HTMLLM_PORT" "8000"
  "HTMLLM_KEEP_ALIVE_TIMEOUT_S" (include "htmllm.settingValue" $s.keepAliveTimeoutSeconds)
  "HTMLLM_BACKEND" $s.backend
  "HTMLLM_DEVICE" (ternary "cuda" "cpu" .Values.gpu.enabled)
  "HTMLLM_DTYPE" $s.dtype
  "HTMLLM_ONNX_QUANTIZE" $s.onnxQuantize
  "HTMLLM_ATTENTION" $s.attention
  "HTMLLM_PREPROCESS_POOL" $s.preprocessPool
  "HTMLLM_INFERENCE_PROCESS" (include "htmllm.settingValue" $s.inferenceProcess)
  "HTMLLM_MAX_BATCH_TOKENS" (include "htmllm.settingValue" $s.maxBatchTokens)
  "HTMLLM_MAX_BATCH_REQUESTS" (include "htmllm.settingValue" $s.maxBatchRequests)
  "HTMLLM_MAX_WAIT_MS" (include "htmllm.settingValue" $s.maxWaitMs)
  "HTMLLM_MAX_QUEUE_DOCUMENTS" (include "htmllm.settingValue" $s.maxQueueDocuments)
  "HTMLLM_MAX_BODY_BYTES" (include "htmllm.settingValue" $s.maxBodyBytes)
  "HTMLLM_MAX_INFLIGHT_BYTES" (include "htmllm.settingValue" $s.maxInflightBytes)
  "HTMLLM_MAX_DOCUMENTS" (include "htmllm.settingValue" $s.maxDocuments)
  "HTMLLM_REQUEST_TIMEOUT_S" (include "htmllm.settingValue" $s.requestTimeoutSeconds)
  "HTMLLM_BODY_TIMEOUT_S" (include "htmllm.settingValue" $s.bodyTimeoutSeconds)
  "HTMLLM_DRAIN_TIMEOUT_S" (include "htmllm.settingValue" $s.drainTimeoutSeconds)
}}
{{- if $s.intraOpThreads }}
{{- $_ := set $settings "HTMLLM_INTRA_OP_THREADS" (include "htmllm.settingValue" $s.intraOpThreads) }}
{{- end }}
{{- if $s.preprocessWorkers }}
{{- $_ := set $settings "HTMLLM_PREPROCESS_WORKERS" (include "htmllm.settingValue" $s.preprocessWorkers) }}
{{- end }}
{{- with (include "htmllm.modelPath" .) }}
{{- $_ := set $settings "HTMLLM_MODEL_PATH" . }}
{{- end }}
{{- toJson $settings }}
{{- end }}

{{/*
The ConfigMap's data: the chart's own settings (htmllm.settings: HTMLLM_PORT is the container port the
probes and the Service use), then extraSettings, which htmllm.validate keeps from setting any of them again.
*/}}
{{- define "htmllm.configData" -}}
{{- $data := include "htmllm.settings" . | fromJson }}
{{- range $key, $value := .Values.extraSettings | default dict }}
{{- $_ := set $data $key (include "htmllm.settingValue" $value) }}
{{- end }}
{{- toYaml $data }}
{{- end }}

{{/*
The ConfigMap's name: the release's, plus the first 10 hex digits of its data's checksum. Different
settings are a new ConfigMap, and through envFrom a new ReplicaSet, never an edit of the one running pods
load: a pod of the previous ReplicaSet that restarts (OOM, liveness), is rescheduled (a node drain) or is
added by the HPA while a rollout is under way, or stuck on settings that crash, starts with the settings
it was made for. The ConfigMap is immutable: a name stands for one content.
*/}}
{{- define "htmllm.configMapName" -}}
{{- printf "%s-%s" (include "htmllm.fullname" .) (include "htmllm.configData" . | sha256sum | trunc 10) }}
{{- end }}

{{/*
The earlier settings' ConfigMaps that pods still load, as a JSON list of the live objects: each one a
ReplicaSet of this release's Deployment loads while it has pods (replicas above 0), other than this
release's own. Helm deletes what a release no longer renders as soon as it has applied the new objects,
long before the rollout has replaced the old pods, whose restarts would then fail
(CreateContainerConfigError); so each release renders them again, and one goes with the first upgrade
after its ReplicaSet has scaled to 0 (and all go with the release on uninstall). `lookup` sees no cluster
under `helm template` and a client-side dry run: there, none. tests/deploy/test_helm_configmap.py replaces
the two lookups below with fixed objects: keep each a single call.
*/}}
{{- define "htmllm.liveConfigMaps" -}}
{{- $current := include "htmllm.configMapName" . }}
{{- $deployment := include "htmllm.fullname" . }}
{{- $names := list }}
{{- $replicaSets := lookup "apps/v1" "ReplicaSet" .Release.Namespace "" }}
{{- range $replicaSets.items | default list }}
{{- $ours := false }}
{{- range .metadata.ownerReferences | default list }}
{{- if and (eq .kind "Deployment") (eq .name $deployment) }}{{ $ours = true }}{{ end }}
{{- end }}
{{- if and $ours (gt (int (.spec.replicas | default 0)) 0) }}
{{- range .spec.template.spec.containers }}
{{- range .envFrom | default list }}
{{- with .configMapRef }}
{{- if and (ne .name $current) (not (has .name $names)) }}{{ $names = append $names .name }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $live := list }}
{{- range $name := $names }}
{{- $configMap := lookup "v1" "ConfigMap" $.Release.Namespace $name }}
{{- if $configMap }}{{ $live = append $live $configMap }}{{ end }}
{{- end }}
{{- toJson $live }}
{{- end }}

{{/*
The pods' labels: the chart's, with podLabels added. A selector label (app.kubernetes.io/name, /instance)
in podLabels is refused (htmllm.validate): the Deployment's selector would no longer match its pods. Any
other label the chart sets, podLabels may replace (app.kubernetes.io/version, say, for a tag other than
the appVersion). A dict, so a key is never written twice.
*/}}
{{- define "htmllm.podLabels" -}}
{{- toYaml (merge (deepCopy (.Values.podLabels | default dict)) (include "htmllm.labels" . | fromYaml)) }}
{{- end }}

{{/*
The pods' annotations: the Prometheus scrape annotations when metrics.podAnnotations, and podAnnotations,
which win where both set a key (prometheus.io/scrape "false" pauses scraping). A dict, so a key is never
written twice (the API server refuses a manifest that does).
*/}}
{{- define "htmllm.podAnnotations" -}}
{{- $annotations := dict }}
{{- if .Values.metrics.podAnnotations }}
{{- $annotations = dict "prometheus.io/scrape" "true" "prometheus.io/port" "8000" "prometheus.io/path" "/metrics" }}
{{- end }}
{{- with merge (deepCopy (.Values.podAnnotations | default dict)) $annotations }}{{ toYaml . }}{{ end }}
{{- end }}

{{/*
The pods' nodeSelector and tolerations: the values', plus the GPU ones when gpu.enabled. The `helm test`
pod uses them too, so that it runs where the server pods run (the nodes that can pull the image, and on
GPU values the nodes that already hold the multi-GB CUDA image).
*/}}
{{- define "htmllm.nodeSelector" -}}
{{- $nodeSelector := deepCopy (.Values.nodeSelector | default dict) }}
{{- if .Values.gpu.enabled }}
{{- $nodeSelector = merge $nodeSelector (.Values.gpu.nodeSelector | default dict) }}
{{- end }}
{{- with $nodeSelector }}{{ toYaml . }}{{ end }}
{{- end }}

{{- define "htmllm.tolerations" -}}
{{- $tolerations := .Values.tolerations | default list }}
{{- if .Values.gpu.enabled }}
{{- $tolerations = concat $tolerations (.Values.gpu.tolerations | default list) }}
{{- end }}
{{- with $tolerations }}{{ toYaml . }}{{ end }}
{{- end }}

{{/*
The Deployment's live replica count, when the release is upgraded with autoscaling on; empty on install,
and under `helm template` or a client-side dry run (lookup returns nothing there). Leaving `replicas` out
of the Deployment while the HPA owns the count is not enough: on the upgrade that switches autoscaling
on, Helm's three-way merge sees a field the previous release set and this one drops, deletes it, and the
API server defaults it to 1, so the Deployment scales down to one pod until the HPA reacts and new pods
have loaded their model. Rendering the count the HPA (or the previous release) set keeps it, on that
upgrade and on every later one (never dropping the field again). tests/deploy/test_helm.py replaces the
`lookup` below with a fixed object: keep it a single call.
*/}}
{{- define "htmllm.liveReplicas" -}}
{{- $live := lookup "apps/v1" "Deployment" .Release.Namespace (include "htmllm.fullname" .) }}
{{- if and $live (hasKey $live "spec") (hasKey $live.spec "replicas") }}
{{- int $live.spec.replicas }}
{{- end }}
{{- end }}

{{/* Fail early on combinations that would render a pod that cannot start. */}}
{{- define "htmllm.validate" -}}
{{- if ne (int .Values.gpu.count) 1 }}
{{- fail (printf "gpu.count is %v: one server process drives one GPU, so a pod with more would leave the rest idle; keep gpu.count 1 and raise the replicas (autoscaling.maxReplicas / replicaCount) instead" .Values.gpu.count) }}
{{- end }}
{{- if and .Values.auth.enabled (not .Values.auth.existingSecret) (not .Values.auth.apiKey) }}
{{- fail "auth.enabled needs auth.existingSecret (recommended) or auth.apiKey" }}
{{- end }}
{{- if lt (float64 .Values.server.maxInflightBytes) (float64 .Values.server.maxBodyBytes) }}
{{- fail (printf "server.maxInflightBytes (%s) must be at least server.maxBodyBytes (%s): a body of the largest accepted size could never be taken" (include "htmllm.settingValue" .Values.server.maxInflightBytes) (include "htmllm.settingValue" .Values.server.maxBodyBytes)) }}
{{- end }}
{{- if not (has .Values.model.source (list "bundled" "pvc" "initContainer")) }}
{{- fail (printf "model.source must be bundled, pvc or initContainer, not %q" .Values.model.source) }}
{{- end }}
{{- if and (eq .Values.model.source "pvc") (not .Values.model.pvc.existingClaim) (not .Values.model.pvc.create) }}
{{- fail "model.source=pvc needs model.pvc.existingClaim or model.pvc.create" }}
{{- end }}
{{- if and (eq .Values.model.source "initContainer") (not .Values.model.initContainer.image) }}
{{- fail "model.source=initContainer needs model.initContainer.image" }}
{{- end }}
{{- $extraSettings := .Values.extraSettings | default dict }}
{{- range $key, $_ := $extraSettings }}
{{- if not (hasPrefix "HTMLLM_" $key) }}
{{- fail (printf "extraSettings key %q must start with HTMLLM_" $key) }}
{{- end }}
{{- if eq $key "HTMLLM_API_KEY" }}
{{- fail "HTMLLM_API_KEY must come from a Secret (auth.existingSecret), not extraSettings" }}
{{- end }}
{{- if and $.Values.auth.enabled (eq $key "HTMLLM_API_KEY_FILE") }}
{{- fail "extraSettings.HTMLLM_API_KEY_FILE: with auth.enabled the chart mounts the key file itself" }}
{{- end }}
{{- end }}
{{- /* A setting given twice: a duplicate ConfigMap key, or an env entry that silently wins over the
ConfigMap. HTMLLM_PORT elsewhere than 8000 fails every probe; HTMLLM_DRAIN_TIMEOUT_S above
server.drainTimeoutSeconds outlives the grace period, so the kubelet kills the drain. */}}
{{- $managed := include "htmllm.settings" . | fromJson }}
{{- range $key, $_ := $extraSettings }}
{{- if hasKey $managed $key }}
{{- fail (printf "extraSettings.%s: the chart sets %s itself (from server.*, gpu.*, model.*); set it there" $key $key) }}
{{- end }}
{{- end }}
{{- range .Values.extraEnv | default list }}
{{- if or (hasKey $managed .name) (and $.Values.auth.enabled (has .name (list "HTMLLM_API_KEY" "HTMLLM_API_KEY_FILE"))) }}
{{- fail (printf "extraEnv %s: the chart sets it itself (from server.*, gpu.*, model.*, auth.*); set it there" .name) }}
{{- end }}
{{- if hasKey $extraSettings .name }}
{{- fail (printf "extraEnv %s: extraSettings.%s sets it too, and the env entry would silently win; set it in one of them" .name .name) }}
{{- end }}
{{- end }}
{{- /* Rendered, linted and refused only by the API server, at apply. */}}
{{- $selector := include "htmllm.selectorLabels" . | fromYaml }}
{{- range $key, $value := .Values.podLabels | default dict }}
{{- /* The chart's own value again is no change (chart 0.2.0 rendered it, as a repeated key). */}}
{{- if and (hasKey $selector $key) (ne (toString $value) (get $selector $key)) }}
{{- fail (printf "podLabels.%s: the chart sets this selector label itself (%s); another value would leave the Deployment's selector matching none of its pods" $key (get $selector $key)) }}
{{- end }}
{{- end }}
{{- include "htmllm.validateModelMount" . }}
{{- /* 0, "0" and "0%" are all none: the schema admits a count or a percentage for either field. */}}
{{- $rollout := .Values.rollingUpdate }}
{{- $zero := list "0" "0%" }}
{{- if and (has (toString $rollout.maxSurge) $zero) (has (toString $rollout.maxUnavailable) $zero) }}
{{- fail "rollingUpdate: maxSurge and maxUnavailable cannot both be 0 (the rollout could never start)" }}
{{- end }}
{{- /* The API server refuses such an HPA at apply, after the other objects may have changed. */}}
{{- $scaling := .Values.autoscaling }}
{{- if and $scaling.enabled (gt (int $scaling.minReplicas) (int $scaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%v) must not exceed autoscaling.maxReplicas (%v)" $scaling.minReplicas $scaling.maxReplicas) }}
{{- end }}
{{- /* The HPA scales on CPU utilization, a percentage of the CPU request: without one it reports
"missing request for cpu" and never scales. */}}
{{- if and $scaling.enabled (not (dig "requests" "cpu" "" (.Values.resources | default dict))) }}
{{- fail "autoscaling.enabled needs resources.requests.cpu: the HPA scales on CPU utilization, a percentage of the CPU request, and without one it never scales" }}
{{- end }}
{{- include "htmllm.validateEngine" . }}
{{- include "htmllm.validateScrapeTimeout" . }}
{{- end }}

{{/*
The model volume's mount path against the pod's own mounts: the same path twice is refused by the API
server at apply, and a parent of one ("/", "/dev") would hide it (the init container mounts /tmp too).
*/}}
{{- define "htmllm.validateModelMount" -}}
{{- if ne .Values.model.source "bundled" }}
{{- $mount := clean .Values.model.mountPath }}
{{- $own := list "/tmp" "/dev/shm" }}
{{- if .Values.auth.enabled }}{{ $own = append $own (include "htmllm.apiKeyDir" .) }}{{ end }}
{{- range $own }}
{{- if or (eq . $mount) (hasPrefix (printf "%s/" (trimSuffix "/" $mount)) .) }}
{{- fail (printf "model.mountPath %s: the pod mounts %s itself (%s); choose a directory of its own, such as /models" $.Values.model.mountPath . (ternary "the API key Secret" "an emptyDir" (eq . (include "htmllm.apiKeyDir" $)))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Combinations the service refuses at start (service.engine.types.EngineConfig and the torch runner's
choose_attention), which would leave the pods in CrashLoopBackOff: refused here, at install.
*/}}
{{- define "htmllm.validateEngine" -}}
{{- $s := .Values.server }}
{{- $gpu := .Values.gpu.enabled }}
{{- if and (not $gpu) (eq $s.dtype "float16") }}
{{- fail "server.dtype float16 needs gpu.enabled; on CPU use float32, or bfloat16 where AMX/AVX512-BF16 exist" }}
{{- end }}
{{- if and (eq $s.backend "onnx") (ne $s.dtype "float32") }}
{{- fail (printf "server.backend onnx runs the float32 graph: set server.dtype float32, not %s (server.onnxQuantize int8 for int8 on CPU)" $s.dtype) }}
{{- end }}
{{- if and (ne $s.onnxQuantize "none") (or (ne $s.backend "onnx") $gpu) }}
{{- fail (printf "server.onnxQuantize %s needs server.backend onnx on CPU (gpu.enabled false)" $s.onnxQuantize) }}
{{- end }}
{{- if and (eq $s.backend "onnx") (ne $s.attention "auto") }}
{{- fail (printf "server.attention %s is the torch backend's: server.backend onnx runs its graph's own attention; leave server.attention auto" $s.attention) }}
{{- end }}
{{- if eq $s.backend "torch" }}
{{- if and (eq $s.attention "flash_attention_2") (or (not $gpu) (eq $s.dtype "float32")) }}
{{- fail "server.attention flash_attention_2 needs gpu.enabled and server.dtype bfloat16 or float16" }}
{{- end }}
{{- if and (eq $s.attention "varlen") $gpu (eq $s.dtype "float32") }}
{{- fail "server.attention varlen on a GPU needs server.dtype bfloat16 or float16" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A Prometheus duration in milliseconds (a float): "500ms" 500, "1m30s" 90000, "0" 0. The schema's pattern
(prometheus-operator's Duration) has already held it to runs of digits each followed by a unit, every unit
at most once and in order (y, w, d, h, m, s, ms), so each run is read on its own; a year is 365 days and a
week 7, as Prometheus counts them. A float, so a duration past int64's milliseconds cannot wrap around.
*/}}
{{- define "htmllm.durationMs" -}}
{{- $unitMs := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+[a-z]+" (toString .) -1 }}
{{- $digits := regexFind "^[0-9]+" . }}
{{- $total = addf $total (mulf (float64 $digits) (get $unitMs (trimPrefix $digits .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
The ServiceMonitor's scrape timeout against its interval. Prometheus refuses a timeout longer than the
interval ("scrape timeout greater than scrape interval"), and prometheus-operator rejects such a
ServiceMonitor: it renders and applies, and the pods are then never scraped, so every alert on their series
stays silent. Only when both are set: an empty one would leave it to the Prometheus's defaults, which the
chart cannot see (the schema makes both required). An interval of "0" is no exception: the operator compares
it as zero. A timeout equal to the interval is taken, as Prometheus takes it.
*/}}
{{- define "htmllm.validateScrapeTimeout" -}}
{{- $monitor := .Values.metrics.serviceMonitor }}
{{- if and $monitor.enabled $monitor.interval $monitor.scrapeTimeout }}
{{- $interval := include "htmllm.durationMs" $monitor.interval | float64 }}
{{- $timeout := include "htmllm.durationMs" $monitor.scrapeTimeout | float64 }}
{{- if gt $timeout $interval }}
{{- fail (printf "metrics.serviceMonitor.scrapeTimeout (%v) must not exceed metrics.serviceMonitor.interval (%v): Prometheus refuses a scrape timeout longer than the interval, and prometheus-operator rejects the ServiceMonitor, so the pods would go unscraped" $monitor.scrapeTimeout $monitor.interval) }}
{{- end }}
{{- end }}
{{- end }}
