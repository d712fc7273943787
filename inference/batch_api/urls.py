"""The Batch API's routes. renq_site.urls mounts them under /v1/ in the OpenAI front door's
namespace (`openai_api:files`, `openai_api:batches`...), so the paths and names are the ones
OpenAI's clients and this project have always used."""

from django.urls import path

from inference.batch_api import views

urlpatterns = [
    path("files", views.files, name="files"),
    path("files/<str:file_id>", views.file_detail, name="file"),
    path("files/<str:file_id>/content", views.file_content, name="file-content"),
    path("batches", views.batches, name="batches"),
    path("batches/<str:batch_id>", views.batch_detail, name="batch"),
    path("batches/<str:batch_id>/cancel", views.batch_cancel, name="batch-cancel"),
]
