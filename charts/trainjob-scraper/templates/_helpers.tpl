{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "trainjob-scraper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "trainjob-scraper.fullname" -}}
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

{{- define "trainjob-scraper.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainjob-scraper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainjob-scraper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trainjob-scraper.labels" -}}
helm.sh/chart: {{ include "trainjob-scraper.chart" . }}
{{ include "trainjob-scraper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: scraper
{{- end }}

{{- define "trainjob-scraper.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainjob-scraper.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trainjob-scraper.leaseName" -}}
{{- default (include "trainjob-scraper.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "trainjob-scraper.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The scraper's configuration file (keys are the option names of scraper/config.py).
Integers go through `int`: values.yaml numbers are floats in templates, and toYaml
would print 1048576 as 1.048576e+06.
*/}}
{{- define "trainjob-scraper.configFile" -}}
{{- $c := .Values.config -}}
{{- $le := .Values.leaderElection -}}
{{- $out := dict
  "namespaces" $c.namespaces
  "interval" $c.interval
  "scrape_timeout" $c.scrapeTimeout
  "concurrency" (int $c.concurrency)
  "default_port" (int $c.defaultPort)
  "default_path" $c.defaultPath
  "max_body_bytes" (int $c.maxBodyBytes)
  "backoff_max" $c.backoffMax
  "write_qps" $c.writeQps
  "write_burst" (int $c.writeBurst)
  "write_attempts" (int $c.writeAttempts)
  "resync_interval" $c.resyncInterval
  "shutdown_timeout" $c.shutdownTimeout
  "log_level" $c.logLevel
  "listen_host" "0.0.0.0"
  "listen_port" (int .Values.metrics.port)
  "leader_election" $le.enabled
  "lease_name" (include "trainjob-scraper.leaseName" .)
  "lease_namespace" .Release.Namespace
  "lease_duration" $le.leaseDuration
  "renew_deadline" $le.renewDeadline
  "retry_period" $le.retryPeriod
-}}
{{- with $c.selector }}
{{- $_ := set $out "selector" . }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{- define "trainjob-scraper.args" -}}
- run
- --config=/etc/trainjob-scraper/config.yaml
{{- range .Values.config.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Rules the scraper needs in every watched namespace (cluster-wide when
config.namespaces is empty): exactly the calls it makes, nothing else.
Keep in sync with docs/operator-guide.md ("RBAC").
*/}}
{{- define "trainjob-scraper.rules" -}}
# Discovery: list + watch of the rank-0 trainer pods (IPs, annotations, termination messages).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# Reads what a TrainJob holds before writing (get) and the periodic resync (list).
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs"]
  verbs: ["get", "list"]
# Server-side apply of status.trainerStatus (field manager trainjob-scraper).
- apiGroups: ["trainer.kubeflow.org"]
  resources: ["trainjobs/status"]
  verbs: ["patch"]
# Warning Events on a TrainJob (invalid status, scrape failures); a repeat bumps the count.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "get", "patch"]
{{- end }}

{{/*
Cluster-scoped: read the TrainJob CRD (only that one) to tell a Trainer release
without status.trainerStatus from the start.
*/}}
{{- define "trainjob-scraper.crdRule" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  resourceNames: ["trainjobs.trainer.kubeflow.org"]
  verbs: ["get"]
{{- end }}
