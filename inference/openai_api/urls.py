"""/v1/: the OpenAI-compatible front door (served under ASGI by renq_site.asgi). The Batch API's
routes (inference.batch_api.urls) join these in renq_site.urls, which mounts
`root_urlpatterns` (Cohere's v2 embed and rerank, TEI's rerank) at their own paths."""

from django.urls import path

from inference.openai_api import views

app_name = "openai_api"

urlpatterns = [
    path("embeddings", views.embeddings, name="embeddings"),
    path("embed", views.embed, name="embed"),
    path("rerank", views.rerank, name="rerank"),
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("models", views.models, name="models"),
    path("models/<str:model>", views.model_detail, name="model"),
]

# Clients of Cohere's v2 API and of TEI call these paths as their SDKs know them.
root_urlpatterns = [
    path("v2/embed", views.embed_v2, name="embed-v2"),
    path("v2/rerank", views.rerank_v2, name="rerank-v2"),
    path("rerank", views.tei_rerank, name="tei-rerank"),
]
