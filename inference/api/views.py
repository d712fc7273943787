from __future__ import annotations

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from inference.api.errors import error_response
from inference.api.serializers import (
    JobAcceptedSerializer,
    JobSerializer,
    JobSubmitSerializer,
    JobSummarySerializer,
    ServiceSerializer,
)
from inference.bulk import submit_bulk
from inference.inputs import InputError
from inference.models import Job, JobStatus, Service
from inference.submission import cancel_job, submit_job
from routing.models import JobAttempt


class JobListCreateView(generics.ListAPIView):
    serializer_class = JobSummarySerializer

    def get_queryset(self):
        # Pieces of bulk jobs are internal; their parent reports progress.
        jobs = Job.objects.filter(tenant=self.request.user, parent__isnull=True).select_related(
            "service", "route__backend"
        )
        status_filter = self.request.query_params.get("status")
        if status_filter:
            if status_filter not in JobStatus.values:
                raise InputError("status", f"must be one of {', '.join(JobStatus.values)}.")
            jobs = jobs.filter(status=status_filter)
        service = self.request.query_params.get("service")
        if service:
            jobs = jobs.filter(service__name=service)
        return jobs

    @extend_schema(request=JobSubmitSerializer, responses={202: JobAcceptedSerializer})
    def post(self, request):
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = submit_job(
            tenant=request.user,
            service_name=body.validated_data["service"],
            payload=body.validated_data["input"],
            priority=body.validated_data.get("priority"),
        )
        return Response(JobAcceptedSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class BulkJobCreateView(APIView):
    @extend_schema(request=JobSubmitSerializer, responses={202: JobSerializer})
    def post(self, request):
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = submit_bulk(
            tenant=request.user,
            service_name=body.validated_data["service"],
            payload=body.validated_data["input"],
            priority=body.validated_data.get("priority"),
        )
        return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


def _own_jobs(request):
    # Another tenant's job is indistinguishable from a missing one: 404, never 403.
    return Job.objects.select_related("service", "route__backend").filter(tenant=request.user)


class JobDetailView(APIView):
    @extend_schema(responses=JobSerializer)
    def get(self, request, job_id):
        attempts = Prefetch(
            "routing_attempts",
            queryset=JobAttempt.objects.select_related("backend").order_by("started_at", "id"),
        )
        job = get_object_or_404(_own_jobs(request).prefetch_related(attempts), pk=job_id)
        return Response(JobSerializer(job).data)

    @extend_schema(responses=JobSerializer)
    def delete(self, request, job_id):
        job = get_object_or_404(_own_jobs(request), pk=job_id)
        if not cancel_job(job):
            return error_response(
                status.HTTP_409_CONFLICT,
                "not_cancellable",
                f"job is {job.status}; only queued jobs can be cancelled.",
                {"status": [job.status]},
            )
        return Response(JobSerializer(job).data)


class ServiceListView(generics.ListAPIView):
    serializer_class = ServiceSerializer
    queryset = Service.objects.filter(active=True)
