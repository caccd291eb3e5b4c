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
  "write_qps_max" $c.writeQpsMax
  "resync_interval" $c.resyncInterval
  "progress_floor" $c.progressFloor
  "metrics_staleness" $c.metricsStaleness
  "other_writer_grace" $c.otherWriterGrace
  "status_target" $c.statusTarget
  "stall_after" (toString $c.stall.after)
  "stall_annotate" $c.stall.annotate
  "priority_boost_max" (int $c.priorityBoost.max)
  "log_source" $c.logSource.enabled
  "log_qps" $c.logSource.qps
  "log_burst" (int $c.logSource.burst)
  "log_limit_bytes" (int $c.logSource.limitBytes)
  "log_tail_lines" (int $c.logSource.tailLines)
  "shutdown_timeout" $c.shutdownTimeout
  "log_level" $c.logLevel
  "listen_host" "0.0.0.0"
  "listen_port" (int .Values.metrics.port)
  "metrics_auth" .Values.metrics.auth.enabled
  "metrics_auth_cache_ttl" .Values.metrics.auth.cacheTTL
  "metrics_auth_cache_size" (int .Values.metrics.auth.cacheSize)
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
The scraper's rules come from files/clusterrole-rules.yaml (one source of truth,
also used by the scraper's own RBAC test); the chart scopes them by resource:
  trainjob-scraper.rules      pods, trainjobs, trainjobs/status, events: the watched scope
                              (plus files/annotation-rules.yaml when statusTarget is
                              annotation or auto, files/log-rules.yaml when
                              logSource.enabled)
  trainjob-scraper.crdRule    customresourcedefinitions, limited to the TrainJob CRD
  trainjob-scraper.leaseRules leases, in the release namespace, get/update by name
  trainjob-scraper.authRules  tokenreviews, subjectaccessreviews: the /metrics authentication
*/}}
{{- define "trainjob-scraper.specialResources" -}}
{{- toJson (list "leases" "customresourcedefinitions" "tokenreviews" "subjectaccessreviews") }}
{{- end }}
{{- define "trainjob-scraper.fileRules" -}}
{{- $rules := .Files.Get "files/clusterrole-rules.yaml" | fromYamlArray }}
{{- range $rules }}
{{- $special := 0 }}
{{- $specials := include "trainjob-scraper.specialResources" $ | fromJsonArray }}
{{- range .resources }}{{ if has . $specials }}{{ $special = add1 $special }}{{ end }}{{ end }}
{{- if and $special (ne (len .resources) 1) }}
{{- fail (printf "files/clusterrole-rules.yaml: keep each of %v in a rule of its own (got %v)" $specials .resources) }}
{{- end }}
{{- end }}
{{- toJson $rules }}
{{- end }}

{{- define "trainjob-scraper.rules" -}}
{{- $out := list }}
{{- $specials := include "trainjob-scraper.specialResources" . | fromJsonArray }}
{{- range (include "trainjob-scraper.fileRules" . | fromJsonArray) }}
{{- if not (has (first .resources) $specials) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- if or (include "trainjob-scraper.writesAnnotation" .) .Values.config.stall.annotate }}
{{- range (.Files.Get "files/annotation-rules.yaml" | fromYamlArray) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- if .Values.config.logSource.enabled }}
{{- range (.Files.Get "files/log-rules.yaml" | fromYamlArray) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- if gt (int .Values.config.priorityBoost.max) 0 }}
{{- range (.Files.Get "files/boost-rules.yaml" | fromYamlArray) }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- if $out }}{{ toYaml $out }}{{ end }}
{{- end }}

{{- define "trainjob-scraper.crdRule" -}}
{{- $out := list }}
{{- range (include "trainjob-scraper.fileRules" . | fromJsonArray) }}
{{- if eq (first .resources) "customresourcedefinitions" }}
{{- $out = append $out (dict "apiGroups" .apiGroups "resources" .resources "resourceNames" (list "trainjobs.trainer.kubeflow.org") "verbs" .verbs) }}
{{- end }}
{{- end }}
{{- if $out }}{{ toYaml $out }}{{ end }}
{{- end }}

{{- define "trainjob-scraper.authRules" -}}
{{- $out := list }}
{{- range (include "trainjob-scraper.fileRules" . | fromJsonArray) }}
{{- if has (first .resources) (list "tokenreviews" "subjectaccessreviews") }}
{{- $out = append $out . }}
{{- end }}
{{- end }}
{{- if $out }}{{ toYaml $out }}{{ end }}
{{- end }}

{{/*
Non-empty when the PrometheusRule is rendered: prometheusRule.enabled true, or auto (the
default) and the cluster serves monitoring.coreos.com/v1 PrometheusRule.
*/}}
{{- define "trainjob-scraper.prometheusRule" -}}
{{- $on := .Values.prometheusRule.enabled -}}
{{- if eq (toString $on) "auto" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule" }}true{{ end -}}
{{- else if $on }}true{{ end -}}
{{- end }}

{{/* Non-empty when config.statusTarget may write the TrainJob annotation (annotation, auto). */}}
{{- define "trainjob-scraper.writesAnnotation" -}}
{{- if has .Values.config.statusTarget (list "annotation" "auto") }}true{{ end }}
{{- end }}

{{/* The scraper's identity as the API server names it (request.userInfo.username). */}}
{{- define "trainjob-scraper.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "trainjob-scraper.serviceAccountName" .) }}
{{- end }}

{{/* `create` cannot be limited to a name (it is not known at authorization time). */}}
{{- define "trainjob-scraper.leaseRules" -}}
{{- $out := list }}
{{- range (include "trainjob-scraper.fileRules" $ | fromJsonArray) }}
{{- if eq (first .resources) "leases" }}
{{- $named := without .verbs "create" }}
{{- if has "create" .verbs }}
{{- $out = append $out (dict "apiGroups" .apiGroups "resources" .resources "verbs" (list "create")) }}
{{- end }}
{{- if $named }}
{{- $out = append $out (dict "apiGroups" .apiGroups "resources" .resources "resourceNames" (list (include "trainjob-scraper.leaseName" $)) "verbs" $named) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $out }}{{ toYaml $out }}{{ end }}
{{- end }}

{{/*
A duration value in seconds, as the scraper parses it (scraper/syntax.py): a number, a
numeric string, or Go-style parts (250ms, 15s, 2m, 1h30m; the schema checks the form).
Prints a float; read it back with `include ... | float64`.
*/}}
{{- define "trainjob-scraper.seconds" -}}
{{- $v := . -}}
{{- if and (kindIs "string" $v) (not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $v)) -}}
{{- $scale := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|s|m|h)" $v -1 -}}
{{- $unit := regexFind "(ms|s|m|h)$" . -}}
{{- $total = addf $total (mulf (float64 (trimSuffix $unit .)) (get $scale $unit)) -}}
{{- end -}}
{{- $total -}}
{{- else -}}
{{- float64 $v -}}
{{- end -}}
{{- end }}

{{/*
Rules on values the JSON schema cannot express (a duration's range, an order between
fields); each failure names the key, the value and the limit, as the scraper would at
start (scraper/config.py), so `helm install` refuses instead of a crash-looping pod.
*/}}
{{- define "trainjob-scraper.validate" -}}
{{- $interval := include "trainjob-scraper.seconds" .Values.config.interval | float64 -}}
{{- if or (lt $interval 1.0) (gt $interval 3600.0) -}}
{{- fail (printf "config.interval=%v (%vs): must be between 1s and 1h" .Values.config.interval $interval) -}}
{{- end -}}
{{- $floor := include "trainjob-scraper.seconds" .Values.config.progressFloor | float64 -}}
{{- if or (lt $floor 0.1) (gt $floor 60.0) -}}
{{- fail (printf "config.progressFloor=%v (%vs): must be between 0.1s and 60s" .Values.config.progressFloor $floor) -}}
{{- end -}}
{{- $stale := include "trainjob-scraper.seconds" .Values.config.metricsStaleness | float64 -}}
{{- if or (lt $stale 0.0) (gt $stale 3600.0) -}}
{{- fail (printf "config.metricsStaleness=%v (%vs): must be between 0s and 3600s" .Values.config.metricsStaleness $stale) -}}
{{- end -}}
{{- if ne (toString .Values.config.stall.after) "auto" -}}
{{- $after := include "trainjob-scraper.seconds" .Values.config.stall.after | float64 -}}
{{- if and (ne $after 0.0) (or (lt $after 5.0) (gt $after 2592000.0)) -}}
{{- fail (printf "config.stall.after=%v (%vs): must be 0 (off), auto, or between 5s and 720h (30 days)" .Values.config.stall.after $after) -}}
{{- end -}}
{{- end -}}
{{- range $key, $value := dict "config.scrapeTimeout" .Values.config.scrapeTimeout "metrics.auth.cacheTTL" .Values.metrics.auth.cacheTTL -}}
{{- if le (include "trainjob-scraper.seconds" $value | float64) 0.0 -}}
{{- fail (printf "%s=%v: must be > 0" $key $value) -}}
{{- end -}}
{{- end -}}
{{- $le := .Values.leaderElection -}}
{{- if and (not $le.enabled) (gt (int .Values.replicaCount) 1) -}}
{{- fail (printf "replicaCount=%v with leaderElection.enabled=false: every replica would scrape every exporter and write every status; set leaderElection.enabled=true (the default) or replicaCount=1" .Values.replicaCount) -}}
{{- end -}}
{{- if $le.enabled -}}
{{- $retry := include "trainjob-scraper.seconds" $le.retryPeriod | float64 -}}
{{- $renew := include "trainjob-scraper.seconds" $le.renewDeadline | float64 -}}
{{- $lease := include "trainjob-scraper.seconds" $le.leaseDuration | float64 -}}
{{- if le $retry 0.0 -}}
{{- fail (printf "leaderElection.retryPeriod=%v: must be > 0" $le.retryPeriod) -}}
{{- end -}}
{{- if not (and (lt $retry $renew) (lt $renew $lease)) -}}
{{- fail (printf "leaderElection: must satisfy retryPeriod < renewDeadline < leaseDuration, got retryPeriod=%v renewDeadline=%v leaseDuration=%v" $le.retryPeriod $le.renewDeadline $le.leaseDuration) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
The stall alert rules (templates/prometheusrule.yaml; docs/operator-guide.md, "When
TrainJobStalled fires").  The scraper already waited each training's threshold, so
TrainJobStalled needs only a short `for`.  TrainJobExporterDown: an exporter that
answered before (the TrainJob has a last update) is down while its pod runs; an
uninstrumented training, which never answered, raises nothing.
*/}}
{{- define "trainjob-scraper.ruleGroups" -}}
{{- $r := .Values.prometheusRule -}}
- name: trainjob-progress.rules
  rules:
    - alert: TrainJobStalled
      expr: max by (namespace, trainjob) (trainjob_progress_stalled) == 1
      for: {{ $r.stalledFor }}
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: TrainJob {{ "{{ $labels.namespace }}/{{ $labels.trainjob }}" }} stalled
        description: >-
          The training's status (progress, remaining time, metrics) has not changed for
          longer than its threshold while its pod runs and its exporter answers.
          See the TrainingStalled Event on the TrainJob and docs/operator-guide.md.
    - alert: TrainJobExporterDown
      expr: >-
        max by (namespace, trainjob) (trainjob_scraper_target_up) == 0
        and on (namespace, trainjob)
        max by (namespace, trainjob) (trainjob_last_update_timestamp_seconds)
      for: {{ $r.exporterDownFor }}
      labels:
        severity: {{ $r.severity }}
      annotations:
        summary: TrainJob {{ "{{ $labels.namespace }}/{{ $labels.trainjob }}" }} exporter down
        description: >-
          The exporter of the TrainJob's target pod answered before and no longer
          answers while the pod runs: its progress is not tracked (not a stall).
{{- end }}
