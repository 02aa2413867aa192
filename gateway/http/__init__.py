"""The HTTP room: the app and its lifespan, the OpenAI-compatible endpoints and their
body checks, the Responses and Messages bridges, admin, the dashboard's files, the spend
API and the OpenAPI document. Everything a request meets before the pipeline."""
