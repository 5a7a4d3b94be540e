{{/*
Names, labels and the values every template derives from. Templates call
"openshell.validate" first (through "openshell.labels"), so a value set the
chart cannot serve fails the render, naming the value to change.
*/}}

{{- define "openshell.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The release's base name. Gateway pods are <fullname>-<i> and hosts
<fullname>-host-<i>: both must stay valid DNS labels, so it is cut to 40.
*/}}
{{- define "openshell.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "openshell.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; "component" names the part (gateway, edge, host). */}}
{{- define "openshell.labels" -}}
{{- include "openshell.validate" .root -}}
helm.sh/chart: {{ include "openshell.chart" .root }}
{{ include "openshell.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "openshell.selectorLabels" -}}
app.kubernetes.io/name: {{ include "openshell.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "openshell.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Object names. */}}
{{- define "openshell.peersService" -}}{{ include "openshell.fullname" . }}-peers{{- end -}}
{{- define "openshell.edgeName" -}}{{ include "openshell.fullname" . }}-edge{{- end -}}
{{- define "openshell.hostName" -}}{{ include "openshell.fullname" . }}-host{{- end -}}

{{/* Secret names: the value, else the documented default. */}}
{{- define "openshell.userTokensSecret" -}}
{{- default (printf "%s-tokens" (include "openshell.fullname" .)) .Values.secrets.userTokens.name -}}
{{- end -}}
{{- define "openshell.peerTokenSecret" -}}
{{- default (printf "%s-peer" (include "openshell.fullname" .)) .Values.secrets.peerToken.name -}}
{{- end -}}
{{- define "openshell.hostTokensSecret" -}}
{{- default (printf "%s-host-tokens" (include "openshell.fullname" .)) .Values.secrets.hostTokens.name -}}
{{- end -}}

{{/* The fully qualified name of a Service of this release. */}}
{{- define "openshell.serviceHost" -}}
{{- printf "%s.%s.svc.%s" .name .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end -}}

{{/*
What supervisors and hosts dial: the built-in edge when there is one (it
routes and marks its failures), else the main Service. Redirects then send
each to the replica that should hold it, by its peer endpoint.
*/}}
{{- define "openshell.supervisorURL" -}}
{{- if .Values.edge.enabled -}}
{{- printf "http://%s:%v" (include "openshell.serviceHost" (dict "name" (include "openshell.edgeName" .) "root" .)) .Values.edge.service.port -}}
{{- else -}}
{{- printf "http://%s:%v" (include "openshell.serviceHost" (dict "name" (include "openshell.fullname" .) "root" .)) .Values.service.port -}}
{{- end -}}
{{- end -}}

{{/* The URL of replica i's own Service (edge routes). */}}
{{- define "openshell.replicaURL" -}}
{{- printf "http://%s:%v" (include "openshell.serviceHost" (dict "name" (printf "%s-replica-%d" (include "openshell.fullname" .root) (int .index)) "root" .root)) .root.Values.service.port -}}
{{- end -}}

{{- define "openshell.cluster" -}}
{{- if gt (int .Values.replicas) 1 -}}true{{- end -}}
{{- end -}}

{{/*
A pod template's annotations: Prometheus's scrape annotations (where
/metrics is, on `port`) when `scrape`, then `extra`. Nothing when both are
empty.
*/}}
{{- define "openshell.podAnnotations" -}}
{{- $annotations := dict -}}
{{- if .scrape -}}
{{- $_ := set $annotations "prometheus.io/scrape" "true" -}}
{{- $_ := set $annotations "prometheus.io/port" (toString .port) -}}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- range $key, $value := .extra -}}
{{- $_ := set $annotations $key $value -}}
{{- end -}}
{{- with $annotations -}}
annotations:
{{ toYaml . | indent 2 }}
{{- end -}}
{{- end -}}

{{/*
Security contexts by isolation mode. `namespaces` makes user, mount, PID and
network namespaces, mounts tmpfs and a fresh /proc inside them, maps sandbox
uids 200000 and up, writes cgroups and opens /dev/net/tun for slirp4netns:
root in a privileged container (README.md, "Security contexts"). `none` runs
as uid 65532 with nothing extra.
*/}}
{{- define "openshell.podSecurityContext" -}}
{{- if .override -}}
{{- toYaml .override -}}
{{- else if eq .root.Values.isolation "none" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- else -}}
runAsUser: 0
runAsGroup: 0
{{- end -}}
{{- end -}}

{{- define "openshell.containerSecurityContext" -}}
{{- if .override -}}
{{- toYaml .override -}}
{{- else if eq .root.Values.isolation "none" -}}
{{- include "openshell.restrictedSecurityContext" . -}}
{{- else -}}
privileged: true
runAsUser: 0
runAsNonRoot: false
readOnlyRootFilesystem: true
{{- end -}}
{{- end -}}

{{/* What the edge and the token copy always run with. */}}
{{- define "openshell.restrictedSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Value sets the chart refuses. Each message names the value to change.
*/}}
{{- define "openshell.validate" -}}
{{- $replicas := int .Values.replicas -}}
{{- if lt $replicas 1 -}}
{{- fail "replicas must be at least 1" -}}
{{- end -}}
{{- if not (has .Values.isolation (list "namespaces" "none")) -}}
{{- fail (printf "isolation must be namespaces or none, not %q" (toString .Values.isolation)) -}}
{{- end -}}
{{- if and (gt $replicas 1) (not .Values.secrets.database.name) -}}
{{- fail (printf "replicas is %d but secrets.database.name is empty: replicas on several pods need a shared PostgreSQL store (the embedded SQLite store lives in one pod's volume); name a Secret holding its postgres:// URL" $replicas) -}}
{{- end -}}
{{- if not (has .Values.gateway.configDeliveryMode (list "poll" "push")) -}}
{{- fail "gateway.configDeliveryMode must be poll or push" -}}
{{- end -}}
{{- if not (has .Values.gateway.resourceLimits (list "auto" "required")) -}}
{{- fail "gateway.resourceLimits must be auto or required" -}}
{{- end -}}
{{- if not (has .Values.hosts.lostPolicy (list "restart" "error")) -}}
{{- fail "hosts.lostPolicy must be restart or error" -}}
{{- end -}}
{{- range $arg := concat .Values.gateway.extraArgs .Values.edge.extraArgs .Values.hosts.extraArgs -}}
{{- if hasPrefix "--dev" (toString $arg) -}}
{{- fail "--dev turns user authentication off and is only allowed on loopback: remove it from extraArgs" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.hosts.enabled (lt (int .Values.hosts.replicas) 1) -}}
{{- fail "hosts.enabled needs hosts.replicas of at least 1: with no host every sandbox create fails" -}}
{{- end -}}
{{- if and .Values.gatewayAPI.enabled (gt $replicas 15) -}}
{{- fail (printf "gatewayAPI: a GRPCRoute holds at most 16 rules (one per replica plus the default), so at most 15 replicas, not %d" $replicas) -}}
{{- end -}}
{{- if and .Values.gatewayAPI.enabled (not .Values.gatewayAPI.parentRefs) -}}
{{- fail "gatewayAPI.enabled needs gatewayAPI.parentRefs: the Gateway (and listener) the GRPCRoute attaches to" -}}
{{- end -}}
{{- if and .Values.ingressNginx.enabled (not .Values.ingressNginx.host) -}}
{{- fail "ingressNginx.enabled needs ingressNginx.host" -}}
{{- end -}}
{{- if and .Values.ingressNginx.enabled (not .Values.ingressNginx.tlsSecretName) -}}
{{- fail "ingressNginx.enabled needs ingressNginx.tlsSecretName: ingress-nginx serves HTTP/2, and so gRPC, to clients over TLS only" -}}
{{- end -}}
{{- if and .Values.ingressNginx.replicaRoutingSnippet .Values.edge.enabled -}}
{{- fail "ingressNginx.replicaRoutingSnippet with edge.enabled: the Ingress sends calls to the built-in edge, which routes them itself; turn the snippet off" -}}
{{- end -}}
{{- end -}}
