"""/v1/: the OpenAI-compatible front door (served under ASGI by renq_site.asgi). The Batch API's
routes (inference.batch_api.urls) join these in renq_site.urls."""

from django.urls import path

from inference.openai_api import views

app_name = "openai_api"

urlpatterns = [
    path("embeddings", views.embeddings, name="embeddings"),
    path("rerank", views.rerank, name="rerank"),
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("models", views.models, name="models"),
    path("models/<str:model>", views.model_detail, name="model"),
]
