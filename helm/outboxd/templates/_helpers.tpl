{{/*
Names. Kubernetes names are limited to 63 characters; suffixes are kept inside it.
*/}}
{{- define "outboxd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "outboxd.fullname" -}}
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

{{/* A name with a suffix, shortened so that name-suffix fits in 63 characters. */}}
{{- define "outboxd.suffixed" -}}
{{- $ctx := index . 0 }}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "outboxd.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "outboxd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels. "outboxd.labels" takes (list $ctx "component").
*/}}
{{- define "outboxd.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "outboxd.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "outboxd.labels" -}}
{{- $ctx := index . 0 -}}
helm.sh/chart: {{ include "outboxd.chart" $ctx }}
{{ include "outboxd.selectorLabels" . }}
app.kubernetes.io/version: {{ include "outboxd.imageTag" $ctx | trunc 63 | quote }}
app.kubernetes.io/part-of: outboxd
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "outboxd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outboxd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Images.
*/}}
{{- define "outboxd.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "outboxd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "outboxd.imageTag" .) }}
{{- end }}
{{- end }}

{{- define "outboxd.relayImage" -}}
{{- $repo := default .Values.image.repository .Values.relay.image.repository }}
{{- if and (not .Values.relay.image.repository) (not .Values.relay.image.tag) .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default (include "outboxd.imageTag" .) .Values.relay.image.tag) }}
{{- end }}
{{- end }}

{{/*
Database and migrations.
*/}}
{{- define "outboxd.inlineDatabase" -}}
{{- if .Values.database.url }}true{{ end }}
{{- end }}

{{- define "outboxd.databaseSecretName" -}}
{{- if .Values.database.url }}
{{- include "outboxd.suffixed" (list . "database") }}
{{- else }}
{{- required "database.existingSecret (a Secret holding the PostgreSQL URL) or, for development, database.url is required" .Values.database.existingSecret }}
{{- end }}
{{- end }}

{{/* The effective migration mode: job, onStart or none. A DDL role of its own
(database.migrations.existingSecret) is for the Job alone: without a Job the pods
would migrate as the runtime role, or nobody would use it. */}}
{{- define "outboxd.migrationMode" -}}
{{- $mode := .Values.migrations.mode }}
{{- $effective := "" }}
{{- if eq $mode "auto" }}
{{- $effective = ternary "onStart" "job" (ne .Values.database.url "") }}
{{- else if eq $mode "job" }}
{{- if .Values.database.url }}
{{- fail "migrations.mode=job needs database.existingSecret: a chart-created Secret (database.url) does not exist yet when the pre-install hook runs. Use mode auto or onStart with database.url." }}
{{- end }}
{{- $effective = "job" }}
{{- else if has $mode (list "onStart" "none") }}
{{- $effective = $mode }}
{{- else }}
{{- fail (printf "migrations.mode must be auto, job, onStart or none, not %q" $mode) }}
{{- end }}
{{- if and .Values.database.migrations.existingSecret (ne $effective "job") }}
{{- fail (printf "database.migrations.existingSecret is the migration Job's role, but no Job runs here (migrations.mode %s%s): the pods would migrate as their own role, or nothing would use it. Use database.existingSecret with migrations.mode auto or job, or leave database.migrations.existingSecret empty" $mode (ternary " with database.url" "" (ne .Values.database.url ""))) }}
{{- end }}
{{- $effective }}
{{- end }}

{{/*
Durations: "outboxd.seconds" turns a compact duration (20s, 1m30s, 500ms, 0) into
whole seconds, rounded up.
*/}}
{{- define "outboxd.seconds" -}}
{{- $raw := toString . }}
{{- if eq $raw "0" }}0{{ else }}
{{- $parts := regexFindAll "[0-9]+(ns|us|ms|s|m|h|d|w)" $raw -1 }}
{{- if or (not $parts) (ne (join "" $parts) $raw) }}
{{- fail (printf "cannot read the duration %q (use a compact form such as 500ms, 20s, 1m30s)" $raw) }}
{{- end }}
{{- $ms := 0 }}
{{- range $parts }}
{{- $n := regexFind "^[0-9]+" . | int64 }}
{{- $unit := regexFind "[a-z]+$" . }}
{{- $factor := index (dict "ns" 0 "us" 0 "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000) $unit | int64 }}
{{- $ms = add $ms (mul $n $factor) }}
{{- end }}
{{- div (add $ms 999) 1000 }}
{{- end }}
{{- end }}

{{- define "outboxd.terminationGracePeriodSeconds" -}}
{{- $drain := include "outboxd.seconds" (default "20s" .Values.config.drainTimeout) | int }}
{{- $pause := int .Values.preStopSleepSeconds }}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- if eq $grace 0 }}
{{- add $drain $pause 10 }}
{{- else if le $grace (add $drain $pause) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed config.drainTimeout (%ds) + preStopSleepSeconds (%d), or the kubelet kills outboxd mid-drain" $grace $drain $pause) }}
{{- else }}
{{- $grace }}
{{- end }}
{{- end }}

{{/*
outboxd configuration as environment variables: one value, one variable. Renders a
YAML map NAME: "value"; empty values are left out so outboxd's default applies.
*/}}
{{- define "outboxd.configEnv" -}}
{{- $c := .Values.config }}
{{- $env := dict }}
{{- $names := dict
  "dbMaxConnections" "OUTBOXD_DB_MAX_CONNECTIONS"
  "dbAcquireTimeout" "OUTBOXD_DB_ACQUIRE_TIMEOUT"
  "dbStartTimeout" "OUTBOXD_DB_START_TIMEOUT"
  "statementTimeout" "OUTBOXD_STATEMENT_TIMEOUT"
  "maxBatch" "OUTBOXD_MAX_BATCH"
  "maxClaimBytes" "OUTBOXD_MAX_CLAIM_BYTES"
  "maxMessageBytes" "OUTBOXD_MAX_MESSAGE_BYTES"
  "maxRequestBytes" "OUTBOXD_MAX_REQUEST_BYTES"
  "maxWaitingClaims" "OUTBOXD_MAX_WAITING_CLAIMS"
  "maxConnections" "OUTBOXD_MAX_CONNECTIONS"
  "defaultLease" "OUTBOXD_DEFAULT_LEASE"
  "minLease" "OUTBOXD_MIN_LEASE"
  "maxLease" "OUTBOXD_MAX_LEASE"
  "maxWait" "OUTBOXD_MAX_WAIT"
  "pollInterval" "OUTBOXD_POLL_INTERVAL"
  "probeInterval" "OUTBOXD_PROBE_INTERVAL"
  "maxAttempts" "OUTBOXD_MAX_ATTEMPTS"
  "backoffBase" "OUTBOXD_BACKOFF_BASE"
  "backoffFactor" "OUTBOXD_BACKOFF_FACTOR"
  "backoffMax" "OUTBOXD_BACKOFF_MAX"
  "backoffJitter" "OUTBOXD_BACKOFF_JITTER"
  "retention" "OUTBOXD_RETENTION"
  "retentionInterval" "OUTBOXD_RETENTION_INTERVAL"
  "claimSweepInterval" "OUTBOXD_CLAIM_SWEEP_INTERVAL"
  "retentionBatch" "OUTBOXD_RETENTION_BATCH"
  "healthInterval" "OUTBOXD_HEALTH_INTERVAL"
  "metricsInterval" "OUTBOXD_METRICS_INTERVAL"
  "watchdogInterval" "OUTBOXD_WATCHDOG_INTERVAL"
  "xminWarnAfter" "OUTBOXD_XMIN_WARN_AFTER"
  "drainTimeout" "OUTBOXD_DRAIN_TIMEOUT"
  "logFormat" "OUTBOXD_LOG_FORMAT"
  "rustLog" "RUST_LOG"
}}
{{- range $key, $name := $names }}
{{- $v := get $c $key }}
{{- /* YAML numbers arrive as float64, which prints 3145728 as 3.145728e+06. */}}
{{- if and (kindIs "float64" $v) (eq $v (floor $v)) }}
{{- $v = int64 $v }}
{{- end }}
{{- if and (not (kindIs "invalid" $v)) (ne (toString $v) "") }}
{{- $_ := set $env $name (toString $v) }}
{{- end }}
{{- end }}
{{- /* outboxd refuses a message limit below the claim budget; say so at install. */}}
{{- $claimBytes := int64 (default 3145728 $c.maxClaimBytes) }}
{{- $messageBytes := int64 (default 8388608 $c.maxMessageBytes) }}
{{- if lt $messageBytes $claimBytes }}
{{- fail (printf "config.maxMessageBytes (%d) must be at least config.maxClaimBytes (%d); empty means outboxd's defaults, 8388608 and 3145728" $messageBytes $claimBytes) }}
{{- end }}
{{- $outboxes := list }}
{{- range $c.outboxes }}
{{- $spec := printf "%s=%s" .name .table }}
{{- /* ordering and poison go first, and only when set; outboxd refuses poison without
ordering=aggregate (exit 64), so say so at install instead. */}}
{{- if and .poison (ne (toString .ordering) "aggregate") }}
{{- fail (printf "config.outboxes[%s].poison (%s) needs ordering: aggregate on that outbox" .name .poison) }}
{{- end }}
{{- with .ordering }}
{{- $spec = printf "%s:ordering=%s" $spec . }}
{{- end }}
{{- with .poison }}
{{- $spec = printf "%s:poison=%s" $spec . }}
{{- end }}
{{- range $opt, $val := (.options | default dict) }}
{{- $spec = printf "%s:%s=%v" $spec $opt $val }}
{{- end }}
{{- $outboxes = append $outboxes $spec }}
{{- end }}
{{- if $outboxes }}
{{- $_ := set $env "OUTBOXD_OUTBOXES" (join "," $outboxes) }}
{{- end }}
{{- $_ := set $env "OUTBOXD_LISTEN" (printf "0.0.0.0:%d" (int .Values.containerPorts.grpc)) }}
{{- $_ := set $env "OUTBOXD_METRICS_LISTEN" (printf "0.0.0.0:%d" (int .Values.containerPorts.metrics)) }}
{{- if .Values.statusPage.enabled }}
{{- $_ := set $env "OUTBOXD_ADMIN_HTTP_LISTEN" (printf "0.0.0.0:%d" (int .Values.containerPorts.status)) }}
{{- end }}
{{- if eq (include "outboxd.migrationMode" .) "onStart" | not }}
{{- $_ := set $env "OUTBOXD_NO_MIGRATE" "true" }}
{{- end }}
{{- include "outboxd.otelEnvMap" (list . "outboxd") | fromYaml | merge $env | toYaml }}
{{- end }}

{{/* OTEL_* variables as a YAML map; takes (list $ctx "default service name"). */}}
{{- define "outboxd.otelEnvMap" -}}
{{- $ctx := index . 0 }}
{{- $o := $ctx.Values.otel }}
{{- $env := dict }}
{{- if $o.enabled }}
{{- $_ := set $env "OTEL_EXPORTER_OTLP_ENDPOINT" (required "otel.endpoint is required when otel.enabled" $o.endpoint) }}
{{- $_ := set $env "OTEL_SERVICE_NAME" (default (index . 1) $o.serviceName) }}
{{- with $o.tracesSampler }}{{ $_ := set $env "OTEL_TRACES_SAMPLER" . }}{{ end }}
{{- with $o.tracesSamplerArg }}{{ $_ := set $env "OTEL_TRACES_SAMPLER_ARG" (toString .) }}{{ end }}
{{- $attrs := list }}
{{- range $k, $v := $o.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%v" $k $v) }}
{{- end }}
{{- if $attrs }}
{{- $_ := set $env "OTEL_RESOURCE_ATTRIBUTES" (join "," $attrs) }}
{{- end }}
{{- end }}
{{- toYaml $env }}
{{- end }}

{{/* A YAML map rendered as a container env list. */}}
{{- define "outboxd.envList" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* The DATABASE_URL env entry, from the Secret. */}}
{{- define "outboxd.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "outboxd.databaseSecretName" . }}
      key: {{ .Values.database.existingSecretKey }}
{{- end }}

{{/* The migration Job's DATABASE_URL: the DDL role's Secret when
database.migrations.existingSecret is given, else the pods' own. */}}
{{- define "outboxd.migrationsDatabaseEnv" -}}
{{- $m := .Values.database.migrations }}
{{- if $m.existingSecret }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $m.existingSecret }}
      key: {{ default .Values.database.existingSecretKey $m.existingSecretKey }}
{{- else }}
{{- include "outboxd.databaseEnv" . }}
{{- end }}
{{- end }}

{{/* Spread constraints with labelSelector filled in; takes (list $constraints $selectorLabelsYaml). */}}
{{- define "outboxd.topologySpread" -}}
{{- $selector := index . 1 | fromYaml }}
{{- range index . 0 }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end }}

{{/* Whether the PodDisruptionBudget is rendered ("true" or empty). */}}
{{- define "outboxd.pdbEnabled" -}}
{{- $p := .Values.podDisruptionBudget }}
{{- if kindIs "invalid" $p.enabled }}
{{- if .Values.autoscaling.enabled }}
{{- if gt (int .Values.autoscaling.minReplicas) 1 }}true{{ end }}
{{- else if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- else if $p.enabled }}true{{ end }}
{{- end }}

{{/* The gRPC address relays use: https:// when outboxd serves TLS. */}}
{{- define "outboxd.serverURL" -}}
{{- $scheme := ternary "https" "http" (.Values.tls.enabled | default false) }}
{{- default (printf "%s://%s.%s.svc:%d" $scheme (include "outboxd.fullname" .) .Release.Namespace (int .Values.service.port)) .Values.relay.server }}
{{- end }}

{{/* The Secret holding outboxd's certificate: tls.existingSecret, or FULLNAME-tls,
which cert-manager writes or, without it, the chart generates. */}}
{{- define "outboxd.tlsSecretName" -}}
{{- default (include "outboxd.suffixed" (list . "tls")) .Values.tls.existingSecret }}
{{- end }}

{{/* "true" when the chart makes the certificate itself: TLS on, from neither
cert-manager nor a given Secret. */}}
{{- define "outboxd.tlsGenerated" -}}
{{- $t := .Values.tls }}
{{- if and $t.enabled (not $t.certManager.enabled) (not $t.existingSecret) }}true{{ end }}
{{- end }}

{{/* The names clients reach outboxd by, as a JSON list: each Service's short name,
NAME.NAMESPACE, NAME.NAMESPACE.svc and NAME.NAMESPACE.svc.cluster.local, the
headless Service's too when it is on. */}}
{{- define "outboxd.serviceDNSNames" -}}
{{- $fullname := include "outboxd.fullname" . }}
{{- $services := list $fullname }}
{{- if .Values.headlessService.enabled }}
{{- $services = append $services (include "outboxd.suffixed" (list . "headless")) }}
{{- end }}
{{- $ns := .Release.Namespace }}
{{- $names := list }}
{{- range $services }}
{{- $names = concat $names (list . (printf "%s.%s" . $ns) (printf "%s.%s.svc" . $ns) (printf "%s.%s.svc.cluster.local" . $ns)) }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/*
The generated certificate as JSON {"ca.crt", "tls.crt", "tls.key", "names"}: the
first three base64 as a Secret's data holds them, "names" the DNS names it was
made for. An upgrade finds the Secret of the release before (Helm's lookup) and
keeps what it holds, so certificate and CA stay the same and relays keep
trusting them; only a first install, a Secret deleted by hand or a change of the
Service's names (the headless Service turned on) makes new ones: an ECDSA P-256
CA and a certificate it signs for the names. The CA's key is not kept, so
nothing else can be signed with it. Made once per render and kept in
.Values.tls, so the Secret and the relay's checksum of the CA see the same one.
*/}}
{{- define "outboxd.generatedTLS" -}}
{{- $t := .Values.tls }}
{{- if not (hasKey $t "outboxdGenerated") }}
{{- if $t.clientCA }}
{{- fail "tls.clientCA needs a CA that signs the clients' certificates, which a certificate the chart generates has not (its CA's key is not kept): use tls.certManager or tls.existingSecret with it" }}
{{- end }}
{{- $names := include "outboxd.serviceDNSNames" . | fromJsonArray }}
{{- $found := lookup "v1" "Secret" .Release.Namespace (include "outboxd.tlsSecretName" .) }}
{{- $old := dict }}
{{- if $found }}
{{- $old = $found.data | default dict }}
{{- $made := index ($found.metadata.annotations | default dict) "outboxd.io/dns-names" | default "" }}
{{- if ne $made (join "," $names) }}
{{- $old = dict }}
{{- end }}
{{- end }}
{{- $data := dict }}
{{- if and (index $old "ca.crt") (index $old "tls.crt") (index $old "tls.key") }}
{{- $data = dict "ca.crt" (index $old "ca.crt") "tls.crt" (index $old "tls.crt") "tls.key" (index $old "tls.key") }}
{{- else }}
{{- $days := int $t.generated.validityDays }}
{{- $ca := genCAWithKey (printf "%s CA" (include "outboxd.fullname" .)) $days (genPrivateKey "ecdsa") }}
{{- $cert := genSignedCertWithKey (first $names) nil $names $days $ca (genPrivateKey "ecdsa") }}
{{- $data = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) }}
{{- end }}
{{- $_ := set $data "names" (join "," $names) }}
{{- $_ := set $t "outboxdGenerated" $data }}
{{- end }}
{{- toJson (get $t "outboxdGenerated") }}
{{- end }}

{{/* Where outboxd's certificate and tokens file are mounted. */}}
{{- define "outboxd.tlsDir" -}}/etc/outboxd/tls{{- end }}
{{- define "outboxd.authDir" -}}/etc/outboxd/auth{{- end }}

{{/*
The trust boundary's variables for the outboxd container, as a YAML map: TLS,
the health-only port the probes use with TLS on, and authorisation. The chart
listens on 0.0.0.0, where outboxd refuses to serve an open API unless told to
(exit 64): the chart refuses the same at install, with the way out.
*/}}
{{- define "outboxd.trustEnv" -}}
{{- $env := dict }}
{{- $a := .Values.auth }}
{{- if and (not $a.tokensSecret) (not $a.allowUnauthenticated) }}
{{- fail "outboxd listens on 0.0.0.0 here, so it needs authorisation: set auth.tokensSecret (a Secret with the tokens file; see the chart README, \"TLS and authorisation\"), or auth.allowUnauthenticated=true to serve the API to anyone who reaches it" }}
{{- end }}
{{- if $a.tokensSecret }}
{{- $_ := set $env "OUTBOXD_AUTH_TOKENS" (printf "%s/%s" (include "outboxd.authDir" .) $a.tokensSecretKey) }}
{{- end }}
{{- if $a.allowUnauthenticated }}
{{- $_ := set $env "OUTBOXD_ALLOW_UNAUTHENTICATED" "true" }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- $dir := include "outboxd.tlsDir" . }}
{{- $_ := set $env "OUTBOXD_TLS_CERT" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $env "OUTBOXD_TLS_KEY" (printf "%s/tls.key" $dir) }}
{{- if .Values.tls.clientCA }}
{{- $_ := set $env "OUTBOXD_TLS_CLIENT_CA" (printf "%s/ca.crt" $dir) }}
{{- end }}
{{- with .Values.tls.reloadInterval }}
{{- $_ := set $env "OUTBOXD_TLS_RELOAD_INTERVAL" (toString .) }}
{{- end }}
{{- $_ := set $env "OUTBOXD_HEALTH_LISTEN" (printf "0.0.0.0:%d" (int .Values.containerPorts.health)) }}
{{- end }}
{{- toYaml $env }}
{{- end }}

{{/* The port the gRPC probes use: the plaintext health-only one when the API port speaks TLS. */}}
{{- define "outboxd.probePort" -}}
{{- if .Values.tls.enabled }}{{ .Values.containerPorts.health }}{{ else }}{{ .Values.containerPorts.grpc }}{{ end }}
{{- end }}

{{/*
NetworkPolicy peers from {cidrs, namespaceSelector, podSelector}: the CIDRs when
given, else the selectors (an empty namespaceSelector means the release namespace).
*/}}
{{- define "outboxd.peers" -}}
{{- if .cidrs }}
{{- range .cidrs }}
- ipBlock:
    cidr: {{ . }}
{{- end }}
{{- else }}
- podSelector:
    {{- toYaml (.podSelector | default dict) | nindent 4 }}
  {{- with .namespaceSelector }}
  namespaceSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Who may reach the API port and the status page: this release's relay and
test pods, every pod of the release namespace with grpcFromReleaseNamespace, and
pods of the labelled client namespaces. */}}
{{- define "outboxd.apiPeers" -}}
{{- $np := .Values.networkPolicy }}
- podSelector:
    matchLabels:
      app.kubernetes.io/instance: {{ .Release.Name }}
    matchExpressions:
      - key: app.kubernetes.io/component
        operator: In
        values:
          - relay
          - test
{{- if $np.ingress.grpcFromReleaseNamespace }}
- podSelector: {}
{{- end }}
- namespaceSelector:
    {{- toYaml $np.ingress.grpcNamespaceSelector | nindent 4 }}
  podSelector:
    {{- toYaml $np.ingress.grpcPodSelector | nindent 4 }}
{{- end }}

{{/* Egress rules every chart pod needs: DNS, and the OTLP collector with otel on. */}}
{{- define "outboxd.commonEgress" -}}
{{- $np := .Values.networkPolicy }}
{{- if $np.egress.dns.enabled }}
- to:
    - namespaceSelector:
        {{- toYaml $np.egress.dns.namespaceSelector | nindent 8 }}
      podSelector:
        {{- toYaml $np.egress.dns.podSelector | nindent 8 }}
  ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end }}
{{- if .Values.otel.enabled }}
- to:
    {{- include "outboxd.peers" $np.egress.otlp | trim | nindent 4 }}
  ports:
    {{- range $np.egress.otlp.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}
{{- end }}

{{/* A number as PromQL reads it: 1000000, not Go's 1e+06. */}}
{{- define "outboxd.promNumber" -}}
{{- if eq (float64 .) (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end -}}
{{- end }}
