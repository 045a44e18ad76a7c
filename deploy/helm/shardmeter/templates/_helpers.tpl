{{/* Chart name, truncated to a DNS label. */}}
{{- define "shardmeter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<chart>" (or the release name when it already contains the chart name). */}}
{{- define "shardmeter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object of the release (no component). */}}
{{- define "shardmeter.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "shardmeter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shardmeter
{{- end }}

{{/* Labels of the operator's objects. */}}
{{- define "shardmeter.labels" -}}
{{ include "shardmeter.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels selecting the operator pod. */}}
{{- define "shardmeter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardmeter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "shardmeter.serviceAccountName" -}}
{{- default (include "shardmeter.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The benchmark Jobs' ServiceAccount. */}}
{{- define "shardmeter.benchServiceAccountName" -}}
{{- default (printf "%s-bench" (include "shardmeter.fullname" .)) .Values.benchServiceAccount.name }}
{{- end }}

{{/* "repository@digest" or "repository:tag" (tag defaults to appVersion). Argument: the image values. */}}
{{- define "shardmeter.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* RBAC rules where TrainingPlans live (shardmeter_operator/k8s/permissions.py, scope "workload"). */}}
{{- define "shardmeter.workloadRules" }}
  # TrainingPlans (patch: kopf removes finalizers an older version left), their status, and
  # blockOwnerDeletion on their children
  - apiGroups: ["shardmeter.io"]
    resources: ["trainingplans"]
    verbs: ["get", "list", "watch", "patch", "create"]
  - apiGroups: ["shardmeter.io"]
    resources: ["trainingplans/status"]
    verbs: ["patch"]
  - apiGroups: ["shardmeter.io"]
    resources: ["trainingplans/finalizers"]
    verbs: ["update"]
  # island and benchmark Jobs: created, followed, deleted by a relaunch; their Services
  - apiGroups: ["batch"]
    resources: ["jobs"]
    verbs: ["get", "list", "watch", "create", "delete"]
  - apiGroups: [""]
    resources: ["services"]
    verbs: ["get", "list", "create", "delete"]
  # the torchft lighthouse of a launched DiLoCo plan
  - apiGroups: ["apps"]
    resources: ["deployments"]
    verbs: ["get", "list", "create", "delete"]
  # the JobSet of a plan launched as workload JobSet (created, followed, deleted by a
  # relaunch); Kueue's Workloads of a queued plan, and the LocalQueue spec.queueName names
  - apiGroups: ["jobset.x-k8s.io"]
    resources: ["jobsets"]
    verbs: ["get", "list", "watch", "create", "delete"]
  # a JobSet or TrainJob placed at admission owns its TrainingPlan (and lighthouse); the
  # model ConfigMap it may name
  - apiGroups: ["jobset.x-k8s.io"]
    resources: ["jobsets/finalizers"]
    verbs: ["update"]
  - apiGroups: ["trainer.kubeflow.org"]
    resources: ["trainjobs"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["trainer.kubeflow.org"]
    resources: ["trainjobs/finalizers"]
    verbs: ["update"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get"]
  - apiGroups: ["kueue.x-k8s.io"]
    resources: ["workloads"]
    verbs: ["list", "watch"]
  - apiGroups: ["kueue.x-k8s.io"]
    resources: ["localqueues"]
    verbs: ["get"]
  # observation of running islands: rank 0's pod and its log (read only, bounded)
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["list"]
  - apiGroups: [""]
    resources: ["pods/log"]
    verbs: ["get"]
  # Events: posted on the operator's objects; FailedCreate (pods refused by quota or
  # PodSecurity) read from the Job controller
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create", "list", "watch"]
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create"]
{{- end }}

{{/* How the placement webhook gets its certificate: "cert-manager" or "self-signed"
(admission.certificates "auto": cert-manager when the cluster serves cert-manager.io/v1). */}}
{{- define "shardmeter.admissionCertificates" -}}
{{- $c := .Values.admission.certificates }}
{{- if eq $c "auto" }}
{{- if .Capabilities.APIVersions.Has "cert-manager.io/v1" }}cert-manager{{ else }}self-signed{{ end }}
{{- else }}{{ $c }}{{ end }}
{{- end }}
