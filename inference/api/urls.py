from django.urls import path

from inference.api import views

urlpatterns = [
    path("jobs", views.JobListCreateView.as_view(), name="job-list"),
    path("jobs/bulk", views.BulkJobCreateView.as_view(), name="job-bulk"),
    path("jobs:batchGet", views.JobBatchGetView.as_view(), name="job-batch-get"),
    path("jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("services", views.ServiceListView.as_view(), name="service-list"),
    path("queues", views.QueueReportView.as_view(), name="queue-report"),
]
