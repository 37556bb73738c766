{{- define "pybk.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pybk.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pybk.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "pybk.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pybk.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "pybk.etcdName" -}}
{{- printf "%s-etcd" (include "pybk.fullname" .) -}}
{{- end -}}

{{- define "pybk.defaultMetadataUri" -}}
{{- if .Values.operator.defaultMetadataUri -}}
{{- .Values.operator.defaultMetadataUri -}}
{{- else if .Values.etcd.enabled -}}
{{- printf "etcd://%s.%s.svc:2379/%s%s" (include "pybk.etcdName" .) .Release.Namespace .Values.etcd.prefix (include "pybk.etcdUriOptions" .) -}}
{{- end -}}
{{- end -}}

{{- define "pybk.sparkServiceAccountName" -}}
{{- default (printf "%s-spark" (include "pybk.fullname" .)) .Values.spark.serviceAccountName -}}
{{- end -}}

{{- define "pybk.caIssuerName" -}}
{{- printf "%s-ca" (include "pybk.fullname" .) -}}
{{- end -}}

{{- define "pybk.etcdTls" -}}
{{- if and .Values.etcd.enabled .Values.etcd.tls.enabled -}}true{{- end -}}
{{- end -}}

{{- define "pybk.etcdAuth" -}}
{{- if and .Values.etcd.enabled .Values.etcd.auth.enabled -}}true{{- end -}}
{{- end -}}

{{- define "pybk.etcdTlsSecretName" -}}
{{- default (printf "%s-etcd-tls" (include "pybk.fullname" .)) .Values.etcd.tls.secretName -}}
{{- end -}}

{{/* The Secret with etcd's client files (ca.crt, password) when the bundled etcd has TLS or auth. */}}
{{- define "pybk.etcdClientSecretName" -}}
{{- if or (include "pybk.etcdTls" .) (include "pybk.etcdAuth" .) -}}
{{- default (printf "%s-etcd-client" (include "pybk.fullname" .)) .Values.etcd.clientSecretName -}}
{{- end -}}
{{- end -}}

{{- define "pybk.etcdRootSecretName" -}}
{{- default (printf "%s-etcd-root" (include "pybk.fullname" .)) .Values.etcd.auth.rootSecretName -}}
{{- end -}}

{{/* The metadata URI options pointing at the client files, mounted at /etc/pybk/etcd. */}}
{{- define "pybk.etcdUriOptions" -}}
{{- $opts := list -}}
{{- if include "pybk.etcdTls" . -}}{{- $opts = append $opts "tls_ca=/etc/pybk/etcd/ca.crt" -}}{{- end -}}
{{- if include "pybk.etcdAuth" . -}}
{{- $opts = append $opts (printf "user=%s" .Values.etcd.auth.user) -}}
{{- $opts = append $opts "password_file=/etc/pybk/etcd/password" -}}
{{- end -}}
{{- if $opts -}}{{- printf "?%s" (join "&" $opts) -}}{{- end -}}
{{- end -}}

{{/* The operator's TLS Secret: operator.tls.secretName, else the chart's operator Certificate. */}}
{{- define "pybk.operatorTlsSecretName" -}}
{{- if .Values.operator.tls.secretName -}}
{{- .Values.operator.tls.secretName -}}
{{- else if .Values.certManager.createIssuer -}}
{{- printf "%s-operator-tls" (include "pybk.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "pybk.operatorEtcdSecretName" -}}
{{- default (include "pybk.etcdClientSecretName" .) .Values.operator.etcdSecretName -}}
{{- end -}}

{{/* NetworkPolicy peers: the pods that may reach bookies and etcd (templates/networkpolicy.yaml). */}}
{{- define "pybk.networkPolicyClients" -}}
# the operator (drains, readiness, audits)
- podSelector:
    matchLabels:
      app.kubernetes.io/name: {{ .Chart.Name }}
      app.kubernetes.io/instance: {{ .Release.Name }}
      app.kubernetes.io/component: operator
# autorecovery (re-replication, auditor forwarding)
- podSelector:
    matchLabels:
      app.kubernetes.io/name: pybk
      app.kubernetes.io/component: autorecovery
# Spark drivers and executors (`pybk spark submit`, examples/spark)
- podSelector:
    matchLabels:
      app.kubernetes.io/name: pybk-spark
# applications
- podSelector:
    matchLabels:
      pybk.io/client: "true"
{{- with .Values.networkPolicy.clientNamespaceSelector }}
- namespaceSelector:
    {{- toYaml . | nindent 4 }}
  podSelector:
    matchLabels:
      app.kubernetes.io/name: pybk-spark
- namespaceSelector:
    {{- toYaml . | nindent 4 }}
  podSelector:
    matchLabels:
      pybk.io/client: "true"
{{- end }}
{{- end -}}
