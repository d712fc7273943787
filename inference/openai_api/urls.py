"""/v1/: the OpenAI-compatible front door (served under ASGI by renq_site.asgi)."""

from django.urls import path

from inference.batches import views as batch_views
from inference.openai_api import views

app_name = "openai_api"

urlpatterns = [
    path("embeddings", views.embeddings, name="embeddings"),
    path("rerank", views.rerank, name="rerank"),
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("models", views.models, name="models"),
    path("models/<str:model>", views.model_detail, name="model"),
    # The Batch API (inference.batches).
    path("files", batch_views.files, name="files"),
    path("files/<str:file_id>", batch_views.file_detail, name="file"),
    path("files/<str:file_id>/content", batch_views.file_content, name="file-content"),
    path("batches", batch_views.batches, name="batches"),
    path("batches/<str:batch_id>", batch_views.batch_detail, name="batch"),
    path("batches/<str:batch_id>/cancel", batch_views.batch_cancel, name="batch-cancel"),
]
