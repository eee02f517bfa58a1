{{/* Names and labels, the way `helm create` spells them. */}}
{{- define "warmfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "warmfleet.fullname" -}}
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

{{- define "warmfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "warmfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* selectorLabels: pass (list $ "component") */}}
{{- define "warmfleet.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "warmfleet.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "warmfleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "warmfleet.operatorServiceAccount" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "warmfleet.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "warmfleet.routerServiceAccount" -}}
{{- if .Values.router.serviceAccount.create }}
{{- default (printf "%s-router" (include "warmfleet.fullname" .)) .Values.router.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.router.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "warmfleet.registerServiceAccount" -}}
{{- default (printf "%s-register" (include "warmfleet.fullname" .)) .Values.registration.serviceAccount.name }}
{{- end }}

{{/* The Secret holding the daemons' admin token: the existing one or the chart's. */}}
{{- define "warmfleet.adminTokenSecret" -}}
{{- default (printf "%s-admin-token" (include "warmfleet.fullname" .)) .Values.adminToken.existingSecret }}
{{- end }}

{{/* Whether the cluster serves the Prometheus Operator's kind: pass (list $ "Kind" "v1"). */}}
{{- define "warmfleet.hasMonitoring" -}}
{{- $ := index . 0 -}}
{{- if $.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/%s/%s" (index . 2) (index . 1)) }}true{{ end }}
{{- end }}

{{/* host:port of a node's URL, for Prometheus targets. */}}
{{- define "warmfleet.target" -}}
{{- $u := urlParse . -}}
{{- if contains ":" $u.host }}{{ $u.host }}{{ else if eq $u.scheme "https" }}{{ $u.host }}:443{{ else }}{{ $u.host }}:80{{ end }}
{{- end }}

{{/* The nodes grouped by how their daemons are scraped: {"http|/": [node, ...], ...}
(scheme and path prefix are per job in Prometheus; host:port is per target). */}}
{{- define "warmfleet.scrapeGroups" -}}
{{- $groups := dict }}
{{- range .Values.nodes }}
{{- $u := urlParse .url }}
{{- $key := printf "%s|%s" $u.scheme (trimSuffix "/" $u.path) }}
{{- $_ := set $groups $key (append (get $groups $key | default list) .) }}
{{- end }}
{{- toYaml $groups }}
{{- end }}
