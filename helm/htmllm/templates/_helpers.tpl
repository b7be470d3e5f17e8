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
{{- define "htmllm.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "htmllm.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/*
The pod's grace period: the preStop sleep and the server's drain must both fit inside it, or the kubelet
kills the server (SIGKILL) with accepted requests still queued.
*/}}
{{- define "htmllm.terminationGracePeriodSeconds" -}}
{{- $needed := add (int .Values.lifecycle.preStopSleepSeconds) (int .Values.server.drainTimeoutSeconds) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $needed 15 }}
{{- else if le (int .Values.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed lifecycle.preStopSleepSeconds + server.drainTimeoutSeconds (%v)" .Values.terminationGracePeriodSeconds $needed) }}
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
{{- range .Values.extraEnv }}
{{- if has .name (list "OMP_NUM_THREADS" "HTMLLM_INTRA_OP_THREADS") }}{{ $named = true }}{{ end }}
{{- end }}
{{- $limits := .Values.resources.limits | default dict }}
{{- $requests := .Values.resources.requests | default dict }}
{{- if and (not .Values.server.intraOpThreads) (not (hasKey .Values.extraSettings "HTMLLM_INTRA_OP_THREADS")) (not $named) (not $limits.cpu) $requests.cpu }}true{{ end }}
{{- end }}

{{/* Fail early on combinations that would render a pod that cannot start. */}}
{{- define "htmllm.validate" -}}
{{- if and .Values.auth.enabled (not .Values.auth.existingSecret) (not .Values.auth.apiKey) }}
{{- fail "auth.enabled needs auth.existingSecret (recommended) or auth.apiKey" }}
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
{{- range $key, $_ := .Values.extraSettings }}
{{- if not (hasPrefix "HTMLLM_" $key) }}
{{- fail (printf "extraSettings key %q must start with HTMLLM_" $key) }}
{{- end }}
{{- if eq $key "HTMLLM_API_KEY" }}
{{- fail "HTMLLM_API_KEY must come from a Secret (auth.existingSecret), not extraSettings" }}
{{- end }}
{{- end }}
{{- end }}
