# The image of every Gantry service in docker-compose.yml (API, beat, workers, Flower).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY apps apps
COPY config config
COPY gantry_client gantry_client
COPY manage.py ./
COPY scripts scripts
# Editable: templates and static files stay where the apps are.
RUN pip install --no-cache-dir -e .
# Static files (the admin's CSS, Swagger UI) collected into the image; WhiteNoise serves
# them from the API process. No secret is needed to collect them.
RUN GANTRY_SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput -v 0
